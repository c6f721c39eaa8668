package console

import (
	"context"
	"crypto/subtle"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hopper-sidecar/hopper/dlq"
	"github.com/hopper-sidecar/hopper/msg"
)

//go:embed assets
var assets embed.FS

// Broker is what the console needs from the broker: the depth of a queue,
// and a DLQ opened the way the dlq tools open it — for reading without
// removing anything (a quorum DLQ rotated), or owned exclusively for a run
// that removes messages. cmd/hopper backs it with dlqconn.Opener.
type Broker interface {
	Depth(ctx context.Context, queue string) (int, error)
	Browse(ctx context.Context, queue string) (dlq.Pass, error)
	// BrowseInPlace is Browse for a reader that may not change the DLQ:
	// a DLQ that Browse would rotate (a quorum DLQ) is refused, with an
	// error wrapping dlq.ErrRotates, before anything is read.
	BrowseInPlace(ctx context.Context, queue string) (dlq.Pass, error)
	// Own opens queue exclusively with a window of prefetch messages and,
	// when inFlight > 0, a publisher with that many confirms pending.
	Own(ctx context.Context, queue string, prefetch, inFlight int) (dlq.Pass, error)
	// Originals makes sure the queue that keeps the originals of queue's
	// edited messages exists, and names it.
	Originals(ctx context.Context, queue string) (string, error)
	// CheckTarget fails when a replay's destination does not exist: the
	// exchange when not "", else the queue.
	CheckTarget(ctx context.Context, exchange, queue string) error
	// Marks reads the marks kept on the broker for queue's failure groups
	// (see dlq.MarksQueue): the empty set when none were ever stored.
	Marks(ctx context.Context, queue string) (dlq.Marks, error)
	// ChangeMarks makes change to queue's marks on behalf of who and
	// returns the set stored, only once the broker holds it durably; on
	// an error the marks are as they were.
	ChangeMarks(ctx context.Context, queue, who string, change func(*dlq.Marks)) (dlq.Marks, error)
}

// DLQ is one dead-letter queue the console shows.
type DLQ struct {
	Name string
	// Queues are the work queues that dead-letter into it.
	Queues []string
	// Through is dlq.ReplayOptions.Through for partitioned queues; nil
	// when none.
	Through func(queue string) (exchange string, ok bool)
}

// Token is a secret that allows actions, and the label the activity list
// shows for whoever used it.
type Token struct {
	Label, Secret string
}

// TokenHeader carries the token of an action. A header, not a cookie: a
// page of another site can make the browser send cookies, not headers.
const TokenHeader = "X-Hopper-Token"

// APIHeader must be on every API call, with the value 1: the console's
// page sets it on each of its fetches. A page of another site cannot send
// a header of its own to the console without the browser first asking the
// console's leave (a CORS preflight), which the console never gives; an
// <img src>, a link or a form sends none. Scripts and curl send it too.
const APIHeader = "Hopper-Console"

// Options configure a Server.
type Options struct {
	DLQs   []DLQ
	Broker Broker
	// AllowActions enables replay, export and purge, and the reads that
	// rotate a quorum DLQ (its scan, a message view); without it the
	// console only reads, and only the DLQs whose messages reading hands
	// back in place (classic ones).
	AllowActions bool
	// ReadsNeedToken makes every API call, reads included, need a token:
	// for a console that answers on an address beyond loopback, where
	// LoopbackOnly cannot keep a web page from reaching it through a DNS
	// name of its own pointed at that address.
	ReadsNeedToken bool
	// Tokens allow actions, and reads when ReadsNeedToken; at least one
	// with either.
	Tokens []Token
	// TraceURL, when set, links a message's x-trace-id: {traceId} is
	// replaced by the id.
	TraceURL string
	// Rate is the default replay rate in messages per second (0: no cap).
	Rate float64
	// MaxReplays keeps messages replayed that many times in the DLQ, as
	// hopper dlq replay --max-replays does. Default 5; -1 disables the
	// cap.
	MaxReplays int
	// SampleEvery is the interval between depth samples. Default 10s.
	SampleEvery time.Duration
	// MaxBody bounds the body shown in the message view, in bytes.
	// Default 64 KiB.
	MaxBody int
	// LoopbackOnly refuses requests whose Host is not a loopback name, so
	// that a web page cannot reach a console on 127.0.0.1 by pointing a
	// DNS name of its own at that address.
	LoopbackOnly bool
	// ScanOnStart scans every DLQ when Run starts: with AllowActions a
	// quorum DLQ too (the one who started the console asked for it),
	// without it only those read in place.
	ScanOnStart bool
	Log         *slog.Logger
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

// Server is the console: an HTTP handler and the background work (depth
// samples, scans, replays) behind it.
type Server struct {
	o      Options
	queues map[string]*queueState
	order  []string

	mu     sync.Mutex
	jobs   []*Job
	nextID int
	// ctx ends the background work; set by Run.
	ctx context.Context
	// born is when the console started, in its replay runs' names.
	born time.Time
	wg   sync.WaitGroup
}

// queueState is one DLQ's part of the console.
type queueState struct {
	DLQ
	sampler *Sampler

	mu       sync.Mutex
	index    *Index
	indexAt  time.Time
	scan     *Job
	busy     *Job
	depth    int
	depthErr string
	depthAt  time.Time
	// rotates is true once a read found that reading the DLQ rotates it.
	rotates bool
	// ignored are the groups an operator marked ignored, by id: they stay
	// in the DLQ and out of the overview's attention figure. They are a
	// copy of the marks kept on the broker (Broker.Marks), read at start
	// and at every sample, so that they outlive the console and every
	// console of the DLQ shows the same ones.
	ignored map[string]dlq.Mark
	// marksErr is why the last read of the marks failed ("" when it did
	// not): until one succeeds, ignored is what was read before.
	marksErr string
	// marksGen counts the sets applied to ignored: a read that started
	// before a change of this console's own ended must not undo it.
	marksGen int
}

// New checks o and returns a server.
func New(o Options) (*Server, error) {
	if o.Broker == nil {
		return nil, errors.New("console: no broker")
	}
	if len(o.DLQs) == 0 {
		return nil, errors.New("console: no DLQ to show")
	}
	if o.AllowActions && len(o.Tokens) == 0 {
		return nil, errors.New("console: actions allowed but no token")
	}
	if o.ReadsNeedToken && len(o.Tokens) == 0 {
		return nil, errors.New("console: reads need a token but there is none")
	}
	for _, t := range o.Tokens {
		if len(t.Secret) < 16 {
			return nil, fmt.Errorf("console: token %q is shorter than 16 characters", t.Label)
		}
	}
	if o.TraceURL != "" {
		if err := CheckTraceURL(o.TraceURL); err != nil {
			return nil, err
		}
	}
	if o.Rate < 0 {
		return nil, fmt.Errorf("console: rate %g: must not be negative", o.Rate)
	}
	if o.MaxReplays == 0 {
		o.MaxReplays = 5
	}
	if o.MaxReplays < 0 {
		o.MaxReplays = 0
	}
	if o.SampleEvery <= 0 {
		o.SampleEvery = 10 * time.Second
	}
	if o.MaxBody <= 0 {
		o.MaxBody = 64 << 10
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	s := &Server{o: o, queues: map[string]*queueState{}, ctx: context.Background(), born: o.Now()}
	for _, d := range o.DLQs {
		if _, dup := s.queues[d.Name]; dup {
			continue
		}
		s.queues[d.Name] = &queueState{DLQ: d, sampler: &Sampler{Now: o.Now}, ignored: map[string]dlq.Mark{}}
		s.order = append(s.order, d.Name)
	}
	return s, nil
}

// CheckTraceURL checks a trace link template: an http(s) URL with
// {traceId} in it.
func CheckTraceURL(tmpl string) error {
	if !strings.Contains(tmpl, "{traceId}") {
		return fmt.Errorf("trace URL %q: want {traceId} where the trace id goes", tmpl)
	}
	u, err := url.Parse(strings.ReplaceAll(tmpl, "{traceId}", "0"))
	if err != nil {
		return fmt.Errorf("trace URL %q: %w", tmpl, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return fmt.Errorf("trace URL %q: want an http or https URL with a host", tmpl)
	}
	return nil
}

// Run samples depths every SampleEvery, and scans every DLQ first when
// ScanOnStart, until ctx ends; then it waits for the runs it started
// (which end with ctx, handing back what they hold).
func (s *Server) Run(ctx context.Context) {
	s.mu.Lock()
	s.ctx = ctx
	s.mu.Unlock()
	s.sample(ctx)
	s.readMarks(ctx)
	if s.o.ScanOnStart {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			for _, name := range s.order {
				_, err := s.startScan(s.queues[name], "console start", s.o.AllowActions, true)
				switch {
				case errors.Is(err, dlq.ErrRotates):
					s.o.Log.Info("console: not scanned at start", "dlq", name, "why", err.Error())
				case err != nil:
					s.o.Log.Warn("console: scan at start", "dlq", name, "error", err.Error())
				}
			}
		}()
	}
	tick := time.NewTicker(s.o.SampleEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			s.wg.Wait()
			return
		case <-tick.C:
			s.sample(ctx)
			s.readMarks(ctx)
		}
	}
}

// sample reads every DLQ's depth. A DLQ a run is reading is skipped: the
// broker counts only ready messages, and those the run holds would show
// as a fall of the depth and, when handed back, as as many arrivals.
func (s *Server) sample(ctx context.Context) {
	for _, name := range s.order {
		q := s.queues[name]
		q.mu.Lock()
		busy := q.busy != nil
		q.mu.Unlock()
		if busy {
			continue
		}
		d, err := s.o.Broker.Depth(ctx, name)
		q.mu.Lock()
		q.depthAt = s.o.Now()
		if err != nil {
			q.depthErr = err.Error()
		} else {
			q.depth, q.depthErr = d, ""
		}
		q.mu.Unlock()
		if err == nil {
			q.sampler.Add(d)
		}
	}
}

// readMarks reads every DLQ's marks from the broker: another console may
// have changed them. A read that fails keeps the marks read before, and
// the overview says why. A DLQ whose depth could not be read is passed
// over: the broker is unreachable or the DLQ missing, and a second
// attempt to connect would only hold up the next sample.
func (s *Server) readMarks(ctx context.Context) {
	for _, name := range s.order {
		q := s.queues[name]
		q.mu.Lock()
		gen, down := q.marksGen, q.depthErr != ""
		q.mu.Unlock()
		if down {
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, marksTimeout)
		m, err := s.o.Broker.Marks(rctx, name)
		cancel()
		if err != nil && ctx.Err() != nil {
			return
		}
		q.mu.Lock()
		switch {
		case err != nil:
			if q.marksErr == "" {
				s.o.Log.Warn("console: read ignored marks", "dlq", name, "queue", dlq.MarksQueue(name), "error", err.Error())
			}
			q.marksErr = err.Error()
		case gen == q.marksGen:
			q.setMarks(m)
		}
		q.mu.Unlock()
	}
}

// marksTimeout bounds one read or change of a DLQ's marks.
const marksTimeout = 30 * time.Second

// setMarks makes m the marks q shows. Called with q.mu held.
func (q *queueState) setMarks(m dlq.Marks) {
	q.ignored = m.Clone().Ignored
	q.marksErr = ""
	q.marksGen++
}

// Handler serves the page and the API.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	static, err := fs.Sub(assets, "assets")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	files := http.FileServerFS(static)
	mux.Handle("GET /assets/", http.StripPrefix("/assets/", files))
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		http.ServeFileFS(w, r, static, "index.html")
	})
	mux.HandleFunc("GET /api/overview", s.overview)
	mux.HandleFunc("GET /api/dlqs/{dlq}/groups", s.groups)
	mux.HandleFunc("GET /api/dlqs/{dlq}/groups/{group}/messages", s.groupMessages)
	mux.HandleFunc("GET /api/dlqs/{dlq}/message", s.message)
	mux.HandleFunc("GET /api/dlqs/{dlq}/chart.svg", s.chart)
	mux.HandleFunc("GET /api/jobs", s.listJobs)
	mux.HandleFunc("GET /api/jobs/{id}", s.getJob)
	mux.HandleFunc("POST /api/dlqs/{dlq}/scan", s.postScan)
	mux.HandleFunc("POST /api/dlqs/{dlq}/replay", s.action(s.postReplay))
	mux.HandleFunc("POST /api/dlqs/{dlq}/edit", s.action(s.postEdit))
	mux.HandleFunc("POST /api/dlqs/{dlq}/transform", s.action(s.postTransform))
	mux.HandleFunc("POST /api/dlqs/{dlq}/transform/preview", s.action(s.postTransformPreview))
	mux.HandleFunc("POST /api/dlqs/{dlq}/export", s.action(s.postExport))
	mux.HandleFunc("POST /api/dlqs/{dlq}/purge", s.action(s.postPurge))
	mux.HandleFunc("POST /api/dlqs/{dlq}/groups/{group}/ignore", s.action(s.postIgnore))
	mux.HandleFunc("POST /api/jobs/{id}/cancel", s.action(s.postCancel))
	mux.HandleFunc("POST /api/jobs/{id}/next", s.action(s.postNext))
	return s.guard(mux)
}

// guard sets the security headers on every answer and refuses requests
// from elsewhere: a Host that is not loopback (when LoopbackOnly), and an
// API call, GET included, that another site's page may have sent (see
// fromPage). Only the page and its assets answer anyone: they are the same
// for everyone and read nothing from the broker.
func (s *Server) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
		h.Set("X-Frame-Options", "DENY")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-store")
		if s.o.LoopbackOnly && !loopbackHost(r.Host) {
			httpError(w, http.StatusForbidden, fmt.Errorf("host %q is not a loopback name: the console answers only on localhost (use kubectl port-forward or an SSH tunnel)", r.Host))
			return
		}
		if r.URL.Path != "/" && !strings.HasPrefix(r.URL.Path, "/assets/") {
			if err := fromPage(r); err != nil {
				httpError(w, http.StatusForbidden, err)
				return
			}
			if _, ok := s.token(r.Header.Get(TokenHeader)); s.o.ReadsNeedToken && !ok {
				httpError(w, http.StatusUnauthorized, fmt.Errorf("missing or wrong %s header: this console answers every API call, reads included, only with its token (the Token box)", TokenHeader))
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// loopbackHost reports whether a Host header names this machine's
// loopback.
func loopbackHost(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.Trim(host, "[]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// fromPage refuses an API call that a page other than the console's own
// may have sent. Even a GET: reading a quorum DLQ moves every message, and
// an <img src> on any page the operator visits would otherwise start one
// through a port-forward left open.
//
// Sec-Fetch-Site, where the browser sends it, must say same-origin or none
// (typed by the user); same-site is refused too, as another port of
// localhost is the same site. Origin, when sent, must be the console's
// own. And APIHeader must be there: the console's page sets it, another
// site's page cannot, so a browser too old to send either of the others
// is covered as well.
func fromPage(r *http.Request) error {
	switch site := r.Header.Get("Sec-Fetch-Site"); site {
	case "", "same-origin", "none":
	default:
		return fmt.Errorf("request refused: Sec-Fetch-Site %q shows a page of another origin sent it, and the console's API answers only its own page", site)
	}
	if origin := r.Header.Get("Origin"); origin != "" {
		u, err := url.Parse(origin)
		if err != nil || u.Host != r.Host || u.Scheme != "http" && u.Scheme != "https" {
			return fmt.Errorf("cross-origin request refused (Origin %q, Host %q): the console's API answers only its own page", origin, r.Host)
		}
	}
	if r.Header.Get(APIHeader) != "1" {
		return fmt.Errorf("request without the %s: 1 header refused: the console's API answers only its own page, which sends it (from a script: curl -H '%s: 1')", APIHeader, APIHeader)
	}
	return nil
}

// action wraps a handler that changes a DLQ: allowed only with
// AllowActions, and only with a valid token, whose label names who acted.
func (s *Server) action(h func(w http.ResponseWriter, r *http.Request, who string)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !s.o.AllowActions {
			httpError(w, http.StatusForbidden, errors.New("the console is read-only: start it with --allow-actions to replay, export or purge"))
			return
		}
		label, ok := s.token(r.Header.Get(TokenHeader))
		if !ok {
			httpError(w, http.StatusUnauthorized, fmt.Errorf("missing or wrong %s header: actions need the console's token", TokenHeader))
			return
		}
		h(w, r, label+" from "+r.RemoteAddr)
	}
}

func (s *Server) token(got string) (string, bool) {
	if got == "" {
		return "", false
	}
	label, ok := "", false
	for _, t := range s.o.Tokens {
		// Every token is compared, so the time taken says nothing.
		if subtle.ConstantTimeCompare([]byte(got), []byte(t.Secret)) == 1 && !ok {
			label, ok = t.Label, true
		}
	}
	return label, ok
}

func (s *Server) queue(w http.ResponseWriter, r *http.Request) (*queueState, bool) {
	q, ok := s.queues[r.PathValue("dlq")]
	if !ok {
		httpError(w, http.StatusNotFound, fmt.Errorf("no DLQ %q in the config", r.PathValue("dlq")))
	}
	return q, ok
}

func httpError(w http.ResponseWriter, code int, err error) {
	writeJSON(w, code, map[string]string{"error": err.Error()})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	// The answer is data, never markup: < > & are escaped even inside
	// strings, so a sniffing client cannot take it for HTML.
	enc.SetEscapeHTML(true)
	_ = enc.Encode(v) // the client went away; nothing to tell it
}

// Overview is one DLQ on the overview page.
type Overview struct {
	Name   string   `json:"name"`
	Queues []string `json:"queues"`
	Depth  int      `json:"depth"`
	// DepthError is why the last depth reading failed.
	DepthError string `json:"depthError,omitempty"`
	// PerMinute are the messages arriving per minute, sampled while the
	// console runs; HasRate false until two samples exist.
	PerMinute float64 `json:"perMinute"`
	HasRate   bool    `json:"hasRate"`
	// Oldest and Newest are dead-letter times from the last scan.
	Oldest  time.Time `json:"oldest,omitzero"`
	Newest  time.Time `json:"newest,omitzero"`
	Scanned int       `json:"scanned"`
	Groups  int       `json:"groups"`
	// ScannedAt is when the last complete scan ended.
	ScannedAt time.Time `json:"scannedAt,omitzero"`
	Scan      *JobView  `json:"scan,omitempty"`
	Busy      *JobView  `json:"busy,omitempty"`
	Samples   int       `json:"samples"`
	// Chart is the depth over the console's lifetime.
	Chart Chart `json:"chart"`
	// ReadRotates is true once a read found that reading the DLQ rotates
	// it (a quorum DLQ): its scan and message views are then actions.
	ReadRotates bool `json:"readRotates"`
	// Attention is the messages of the last scan outside the groups marked
	// ignored; Ignored those inside them.
	Attention int `json:"attention"`
	Ignored   int `json:"ignored"`
	// MarksError is why the marks kept on the broker could not be read:
	// the figures then use the marks read before, none at first.
	MarksError string `json:"marksError,omitempty"`
}

// The overview's chart size, in pixels.
const chartWidth, chartHeight = 240, 60

type overviewPage struct {
	DLQs         []Overview `json:"dlqs"`
	AllowActions bool       `json:"allowActions"`
	// TokenNeeded is true when some call needs the token: actions, or
	// every call with ReadsNeedToken.
	TokenNeeded bool    `json:"tokenNeeded"`
	Rate        float64 `json:"rate"`
	MaxReplays  int     `json:"maxReplays"`
}

func (s *Server) overview(w http.ResponseWriter, _ *http.Request) {
	page := overviewPage{AllowActions: s.o.AllowActions, TokenNeeded: s.o.AllowActions || s.o.ReadsNeedToken, Rate: s.o.Rate, MaxReplays: s.o.MaxReplays}
	for _, name := range s.order {
		q := s.queues[name]
		rate, ok := q.sampler.PerMinute()
		q.mu.Lock()
		samples := q.sampler.Samples()
		ov := Overview{Name: name, Queues: q.Queues, Depth: q.depth, DepthError: q.depthErr, PerMinute: rate, HasRate: ok, Samples: len(samples), Chart: DepthChart(samples, chartWidth, chartHeight), ReadRotates: q.rotates, MarksError: q.marksErr}
		if q.index != nil {
			ov.Oldest, ov.Newest, ov.Scanned, ov.Groups, ov.ScannedAt = q.index.Oldest, q.index.Newest, q.index.Scanned, len(q.index.groups), q.indexAt
			for _, g := range q.index.groups {
				if _, ign := q.ignored[g.ID]; ign {
					ov.Ignored += g.Count
				}
			}
			ov.Attention = ov.Scanned - ov.Ignored
		}
		scan, busy := q.scan, q.busy
		q.mu.Unlock()
		if scan != nil {
			v := scan.View(s.o.Now())
			ov.Scan = &v
		}
		if busy != nil {
			v := busy.View(s.o.Now())
			ov.Busy = &v
		}
		if ov.Queues == nil {
			ov.Queues = []string{}
		}
		page.DLQs = append(page.DLQs, ov)
	}
	writeJSON(w, http.StatusOK, page)
}

func (s *Server) chart(w http.ResponseWriter, r *http.Request) {
	q, ok := s.queue(w, r)
	if !ok {
		return
	}
	w.Header().Set("Content-Type", "image/svg+xml")
	_, _ = w.Write([]byte(DepthChart(q.sampler.Samples(), chartWidth, chartHeight).SVG())) // the client went away
}

type groupsPage struct {
	DLQ         string    `json:"dlq"`
	Scanned     int       `json:"scanned"`
	ScannedAt   time.Time `json:"scannedAt,omitzero"`
	Groups      []Group   `json:"groups"`
	Scan        *JobView  `json:"scan,omitempty"`
	ReadRotates bool      `json:"readRotates"`
	// MarksError is why the marks kept on the broker could not be read.
	MarksError string `json:"marksError,omitempty"`
}

func (s *Server) groups(w http.ResponseWriter, r *http.Request) {
	q, ok := s.queue(w, r)
	if !ok {
		return
	}
	q.mu.Lock()
	ix, at, scan, rotates := q.index, q.indexAt, q.scan, q.rotates
	q.mu.Unlock()
	page := groupsPage{DLQ: q.Name, Groups: []Group{}, ScannedAt: at, ReadRotates: rotates}
	if ix != nil {
		page.Scanned, page.Groups = ix.Scanned, ix.Groups()
		q.mu.Lock()
		for i := range page.Groups {
			if m, ign := q.ignored[page.Groups[i].ID]; ign {
				page.Groups[i].Ignored, page.Groups[i].IgnoredBy, page.Groups[i].IgnoredAt = true, m.By, m.At
			}
		}
		q.mu.Unlock()
	}
	q.mu.Lock()
	page.MarksError = q.marksErr
	q.mu.Unlock()
	if scan != nil {
		v := scan.View(s.o.Now())
		page.Scan = &v
	}
	writeJSON(w, http.StatusOK, page)
}

func (s *Server) groupMessages(w http.ResponseWriter, r *http.Request) {
	q, ok := s.queue(w, r)
	if !ok {
		return
	}
	q.mu.Lock()
	ix := q.index
	q.mu.Unlock()
	if ix == nil {
		httpError(w, http.StatusConflict, errors.New("not scanned yet"))
		return
	}
	g, found := ix.Group(r.PathValue("group"))
	if !found {
		httpError(w, http.StatusNotFound, fmt.Errorf("no group %q in the last scan (rescanned since?)", r.PathValue("group")))
		return
	}
	list, n := ix.Messages(g.ID, 200)
	writeJSON(w, http.StatusOK, map[string]any{"group": g, "messages": list, "count": n})
}

// errBusy refuses a second run on a DLQ: the runs read every message
// present, and two at once would each see only part of the DLQ.
var errBusy = errors.New("another scan or action is running on this DLQ; try again when it ends")

// errStopping refuses new runs once the console is shutting down.
var errStopping = errors.New("the console is stopping")

// errFound ends a pass that found the message it looked for.
var errFound = errors.New("found")

// fetch reads the message with id from q without removing anything (see
// firstOf). rotate allows reading a quorum DLQ (see open).
func (s *Server) fetch(ctx context.Context, q *queueState, id string, rotate bool) (*msg.Message, error) {
	found, err := s.firstOf(ctx, q, dlq.Filter{MessageIDs: []string{id}}, 1, rotate)
	if err != nil {
		return nil, err
	}
	if len(found) == 0 {
		return nil, fmt.Errorf("message %q is not in %s (replayed or purged since the scan?)", id, q.Name)
	}
	return found[0], nil
}

// open opens q for a pass that removes nothing. Reading a quorum DLQ
// rotates every message: a copy of each published to the tail and the
// original acked, the DLQ held for as long as the pass takes. That changes
// the DLQ, so only a reader allowed to act passes rotate; without it a
// quorum DLQ is refused before anything is read, and the error says what
// would allow it. A classic DLQ hands every message back in place and is
// read either way. (A queue's type is fixed for its life: it changes only
// by deleting the queue.)
func (s *Server) open(ctx context.Context, q *queueState, rotate bool) (dlq.Pass, error) {
	var p dlq.Pass
	var err error
	if rotate {
		p, err = s.o.Broker.Browse(ctx, q.Name)
	} else {
		p, err = s.o.Broker.BrowseInPlace(ctx, q.Name)
	}
	switch {
	case errors.Is(err, dlq.ErrRotates):
		q.setRotates(true)
		if !s.o.AllowActions {
			return p, fmt.Errorf("%w; a scan or a message view of it is therefore an action, and the console is read-only: start it with --allow-actions and use its token", err)
		}
		return p, fmt.Errorf("%w; a scan or a message view of it is therefore an action: it needs the console's token (the Token box, or the %s header)", err, TokenHeader)
	case err == nil:
		q.setRotates(p.Rotate != nil)
	}
	return p, err
}

// rotationStatus is the status of a read refused because it would rotate
// a quorum DLQ: 401 when the token would allow it, 403 when nothing would.
func (s *Server) rotationStatus() int {
	if s.o.AllowActions {
		return http.StatusUnauthorized
	}
	return http.StatusForbidden
}

// reader tells whether r may read a DLQ that reading rotates — only as an
// action: with actions allowed and a valid token — and names the reader
// for the log and the activity list.
func (s *Server) reader(r *http.Request) (rotate bool, who string) {
	if s.o.AllowActions {
		if label, ok := s.token(r.Header.Get(TokenHeader)); ok {
			return true, label + " from " + r.RemoteAddr
		}
	}
	return false, "from " + r.RemoteAddr
}

func (q *queueState) setRotates(v bool) {
	q.mu.Lock()
	q.rotates = v
	q.mu.Unlock()
}

// claim marks q busy with job (nil: a short read) or fails with errBusy.
func (s *Server) claim(q *queueState, job *Job) (func(), error) {
	if s.background().Err() != nil {
		return nil, errStopping
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.busy != nil {
		return nil, errBusy
	}
	if job == nil {
		job = &Job{Kind: "read", DLQ: q.Name, Started: s.o.Now(), state: StateRunning}
	}
	q.busy = job
	return func() {
		q.mu.Lock()
		q.busy = nil
		q.mu.Unlock()
	}, nil
}

func (s *Server) message(w http.ResponseWriter, r *http.Request) {
	q, ok := s.queue(w, r)
	if !ok {
		return
	}
	id := r.URL.Query().Get("id")
	if id == "" {
		httpError(w, http.StatusBadRequest, errors.New("want ?id=MESSAGE-ID"))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Minute)
	defer cancel()
	rotate, who := s.reader(r)
	m, err := s.fetch(ctx, q, id, rotate)
	switch {
	case errors.Is(err, dlq.ErrRotates):
		httpError(w, s.rotationStatus(), err)
		return
	case errors.Is(err, errBusy):
		httpError(w, http.StatusConflict, err)
		return
	case err != nil:
		httpError(w, http.StatusNotFound, err)
		return
	}
	if rotate {
		s.o.Log.Info("console: message view", "dlq", q.Name, "message", id, "who", who)
	}
	writeJSON(w, http.StatusOK, s.describe(q.Name, m))
}

func (s *Server) listJobs(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	jobs := slices.Clone(s.jobs)
	s.mu.Unlock()
	now := s.o.Now()
	out := make([]JobView, 0, len(jobs))
	for i := len(jobs) - 1; i >= 0; i-- {
		out = append(out, s.view(jobs[i], now))
	}
	writeJSON(w, http.StatusOK, map[string]any{"jobs": out})
}

func (s *Server) job(id string) *Job {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, j := range s.jobs {
		if j.ID == id {
			return j
		}
	}
	return nil
}

func (s *Server) getJob(w http.ResponseWriter, r *http.Request) {
	j := s.job(r.PathValue("id"))
	if j == nil {
		httpError(w, http.StatusNotFound, fmt.Errorf("no job %q", r.PathValue("id")))
		return
	}
	writeJSON(w, http.StatusOK, s.view(j, s.o.Now()))
}

// view is j's view with, for a replay run that has ended, how many of the
// messages it moved are back in its DLQ by the last scan.
func (s *Server) view(j *Job, now time.Time) JobView {
	v := j.View(now)
	if v.RunID == "" || v.State == StateRunning {
		return v
	}
	q := s.queues[v.DLQ]
	if q == nil {
		return v
	}
	q.mu.Lock()
	ix, at := q.index, q.indexAt
	q.mu.Unlock()
	if ix != nil && !at.Before(v.Finished) {
		n := ix.Runs[v.RunID]
		v.CameBack = &n
	}
	return v
}

// postNext lets a batched replay waiting between two batches go on with
// the next.
func (s *Server) postNext(w http.ResponseWriter, r *http.Request, who string) {
	j := s.job(r.PathValue("id"))
	if j == nil {
		httpError(w, http.StatusNotFound, fmt.Errorf("no job %q", r.PathValue("id")))
		return
	}
	if !j.waiting.Load() {
		httpError(w, http.StatusConflict, fmt.Errorf("job %s is not waiting between batches", j.ID))
		return
	}
	select {
	case j.next <- struct{}{}:
	default:
	}
	s.o.Log.Info("console: next batch", "job", j.ID, "dlq", j.DLQ, "who", who)
	writeJSON(w, http.StatusOK, s.view(j, s.o.Now()))
}

func (s *Server) postCancel(w http.ResponseWriter, r *http.Request, who string) {
	j := s.job(r.PathValue("id"))
	if j == nil {
		httpError(w, http.StatusNotFound, fmt.Errorf("no job %q", r.PathValue("id")))
		return
	}
	j.Cancel()
	s.o.Log.Info("console: cancel", "job", j.ID, "kind", j.Kind, "dlq", j.DLQ, "who", who)
	writeJSON(w, http.StatusOK, j.View(s.o.Now()))
}

// movesCopies are the kinds of job that replay copies, each named by its
// run id.
var movesCopies = map[string]bool{"replay": true, "edit": true, "transform": true}

// maxJobs bounds the activity list.
const maxJobs = 500

// newJob records a job in the activity list.
func (s *Server) newJob(kind, dlqName, target, who string, total int) *Job {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nextID++
	j := &Job{ID: strconv.Itoa(s.nextID), Kind: kind, DLQ: dlqName, Target: target, Who: who, Started: s.o.Now(), state: StateRunning, next: make(chan struct{}, 1)}
	if movesCopies[kind] {
		// Unique across restarts of the console: its start time, then the
		// job's number.
		j.RunID = fmt.Sprintf("console %s #%d", s.born.UTC().Format("20060102T150405Z"), s.nextID)
	}
	j.total.Store(int64(total))
	s.jobs = append(s.jobs, j)
	if len(s.jobs) > maxJobs {
		s.jobs = slices.Delete(s.jobs, 0, len(s.jobs)-maxJobs)
	}
	return j
}

func (s *Server) background() context.Context {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ctx
}

// Job states.
const (
	StateRunning   = "running"
	StateDone      = "done"
	StateFailed    = "failed"
	StateCancelled = "cancelled"
)

// Job is one scan or action, in the activity list.
type Job struct {
	ID, Kind, DLQ string
	// Target is the group or message acted on ("" for the whole DLQ).
	Target  string
	Who     string
	Started time.Time
	// RunID names a replay run on the copies it publishes.
	RunID string
	// Batch is the size of a batched replay's batches; waiting is true
	// while it waits between two, for its pause or for next.
	Batch   int
	waiting atomic.Bool
	next    chan struct{}

	total, taken, done atomic.Int64

	mu       sync.Mutex
	state    string
	finished time.Time
	err      string
	summary  string
	cancel   context.CancelFunc
}

// JobView is a job as the API shows it.
type JobView struct {
	ID     string `json:"id"`
	Kind   string `json:"kind"`
	DLQ    string `json:"dlq"`
	Target string `json:"target,omitempty"`
	Who    string `json:"who,omitempty"`
	State  string `json:"state"`
	// Total is the messages the run will take at most; Taken those taken
	// so far; Done those it acted on (replayed, exported, purged, indexed).
	Total    int       `json:"total"`
	Taken    int       `json:"taken"`
	Done     int       `json:"done"`
	Percent  float64   `json:"percent"`
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished,omitzero"`
	// ETA is the time left at the rate so far, with its unit.
	ETA     string `json:"eta,omitempty"`
	Error   string `json:"error,omitempty"`
	Summary string `json:"summary,omitempty"`
	// RunID names a replay run; CameBack counts its messages back in the
	// DLQ (failed again) by the first scan after it ended.
	RunID    string `json:"runId,omitempty"`
	CameBack *int   `json:"cameBack,omitempty"`
	// Batch is a batched replay's batch size; Waiting is true while it
	// waits between two batches (for its pause, or for Next).
	Batch   int  `json:"batch,omitempty"`
	Waiting bool `json:"waiting,omitempty"`
}

// View snapshots the job.
func (j *Job) View(now time.Time) JobView {
	j.mu.Lock()
	defer j.mu.Unlock()
	v := JobView{ID: j.ID, Kind: j.Kind, DLQ: j.DLQ, Target: j.Target, Who: j.Who, State: j.state, Started: j.Started, Finished: j.finished, Error: j.err, Summary: j.summary, RunID: j.RunID, Batch: j.Batch, Waiting: j.waiting.Load(),
		Total: int(j.total.Load()), Taken: int(j.taken.Load()), Done: int(j.done.Load())}
	switch {
	case v.State == StateDone:
		v.Percent = 100
	case v.Total > 0:
		v.Percent = min(100, 100*float64(v.Taken)/float64(v.Total))
	}
	if v.State == StateRunning && v.Taken > 0 && v.Total > v.Taken {
		elapsed := now.Sub(j.Started)
		left := time.Duration(float64(elapsed) * float64(v.Total-v.Taken) / float64(v.Taken))
		v.ETA = left.Round(time.Second).String()
	}
	return v
}

// Cancel stops a running job; what it holds goes back to the DLQ.
func (j *Job) Cancel() {
	j.mu.Lock()
	c := j.cancel
	j.mu.Unlock()
	if c != nil {
		c()
	}
}

func (j *Job) setCancel(c context.CancelFunc) {
	j.mu.Lock()
	j.cancel = c
	j.mu.Unlock()
}

// finish records the job's end.
func (j *Job) finish(now time.Time, summary string, err error, cancelled bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.finished, j.summary = now, summary
	switch {
	case cancelled:
		j.state = StateCancelled
		if err != nil {
			j.err = err.Error()
		}
	case err != nil:
		j.state, j.err = StateFailed, err.Error()
	default:
		j.state = StateDone
	}
}
