package streamsrc

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/logs"
)

var quietOnce sync.Once

// quietClient sends the stream client's log lines, which it prints with
// the standard log package by default, to slog instead, so that Hopper's
// log stays one structured stream. Its lines go to debug, its errors too:
// they are mostly about sockets closing, and what they mean for reading (a
// subscription lost, a store that failed) Hopper logs itself.
// The client keeps one logger for the whole process.
func quietClient() {
	quietOnce.Do(func() { logs.SetLogger(clientLogger{}) })
}

type clientLogger struct{}

func (clientLogger) line(level slog.Level, format string, v ...any) {
	slog.Default().Log(context.Background(), level, fmt.Sprintf(format, v...), "component", "stream-client")
}

func (l clientLogger) Info(format string, v ...any)  { l.line(slog.LevelDebug, format, v...) }
func (l clientLogger) Debug(format string, v ...any) { l.line(slog.LevelDebug, format, v...) }
func (l clientLogger) Warn(format string, v ...any)  { l.line(slog.LevelDebug, format, v...) }
func (l clientLogger) Error(format string, v ...any) { l.line(slog.LevelDebug, format, v...) }
