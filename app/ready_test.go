package app

import (
	"context"
	"encoding/base64"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestReadyErrorsHoldNoCredentials checks that a health check of an app
// URL holding user info sends the credentials (the app may want them on
// its health path too) and prints them nowhere: its errors are logged as
// they are.
func TestReadyErrorsHoldNoCredentials(t *testing.T) {
	const user, pass = "hopper-user", "pw-1f0c2e9d5a"
	var auth atomic.Value
	status := atomic.Int32{}
	status.Store(503)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth.Store(r.Header.Get("Authorization"))
		w.WriteHeader(int(status.Load()))
	}))
	t.Cleanup(srv.Close)
	withCreds := strings.Replace(srv.URL, "http://", "http://"+user+":"+pass+"@", 1)

	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedURL := "http://" + user + ":" + pass + "@" + closed.Addr().String() + "/msg"
	closed.Close()

	var errs []string
	for _, c := range []struct{ url, health string }{
		{withCreds + "/msg", "/healthz"}, // answers 503
		{closedURL, "/healthz"},          // refuses the connection
		{closedURL, ""},                  // TCP connect refused
	} {
		r, err := NewReady(c.url, c.health, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		err = r.Check(context.Background())
		if err == nil {
			t.Fatalf("%s: the check passed", c.url)
		}
		errs = append(errs, err.Error())
	}
	for _, e := range errs {
		if strings.Contains(e, pass) || strings.Contains(e, user) {
			t.Errorf("the error holds the credentials: %s", e)
		}
	}
	if !strings.Contains(errs[0], "answered 503") || !strings.Contains(errs[0], "/healthz") {
		t.Errorf("the error no longer says what answered what: %s", errs[0])
	}
	want := "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pass))
	if got, _ := auth.Load().(string); got != want {
		t.Errorf("the health check sent Authorization %q, want the URL's credentials", got)
	}
	status.Store(200)
	r, err := NewReady(withCreds+"/msg", "/healthz", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Check(context.Background()); err != nil {
		t.Errorf("the check of a healthy app failed: %v", err)
	}
}
