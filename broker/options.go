package broker

import (
	"log/slog"

	"github.com/hopper-sidecar/hopper/config"
)

// ConfigOptions maps the broker section of the config to connection
// options; name labels the connection in the broker's management UI.
func ConfigOptions(b config.Broker, log *slog.Logger, name string) Options {
	return Options{
		URLs:               b.URLs,
		UsernameFile:       b.UsernameFile,
		PasswordFile:       b.PasswordFile,
		CAFile:             b.TLS.CAFile,
		CertFile:           b.TLS.CertFile,
		KeyFile:            b.TLS.KeyFile,
		ServerName:         b.TLS.ServerName,
		InsecureSkipVerify: b.TLS.InsecureSkipVerify,
		Heartbeat:          b.Heartbeat.D(),
		ConnectTimeout:     b.ConnectTimeout.D(),
		ReconnectMin:       b.ReconnectMin.D(),
		ReconnectMax:       b.ReconnectMax.D(),
		Name:               name,
		Logger:             log,
	}
}
