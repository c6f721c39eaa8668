package confdoc

import "testing"

func TestLinkKeys(t *testing.T) {
	links := map[string]string{"retry.outcomes": "retry.outcomes", "reconnectMax": "broker.reconnectMax"}
	for _, c := range []struct{ in, want string }{
		{"laid over retry.outcomes, entry by entry.", "laid over [`retry.outcomes`](#retryoutcomes), entry by entry."},
		{"up to reconnectMax.", "up to [`reconnectMax`](#brokerreconnectmax)."},
		// Once per description, never in code, in a longer name or a URL.
		{"retry.outcomes and retry.outcomes", "[`retry.outcomes`](#retryoutcomes) and retry.outcomes"},
		{"`retry.outcomes` x", "`retry.outcomes` x"},
		{"{retry.outcomes} my.retry.outcomes retry.outcomes-x http://reconnectMax/", "{retry.outcomes} my.retry.outcomes retry.outcomes-x http://reconnectMax/"},
	} {
		if got := linkKeys(c.in, links, map[string]bool{}); got != c.want {
			t.Errorf("linkKeys(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestUnlinkURLs(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"at [http://127.0.0.1:8080/](http://127.0.0.1:8080/).", "at http://127.0.0.1:8080/."},
		{"see [the table](#table) \\[1s]", "see [the table](#table) \\[1s]"},
	} {
		if got := unlinkURLs(c.in); got != c.want {
			t.Errorf("unlinkURLs(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestAnchor(t *testing.T) {
	for in, want := range map[string]string{
		"broker.urls":                    "brokerurls",
		"retry.policies[].match.header":  "retrypoliciesmatchheader",
		"app.auth.standardWebhooks":      "appauthstandardwebhooks",
		"subscriptions[].consumer.batch": "subscriptionsconsumerbatch",
	} {
		if got := anchor(in); got != want {
			t.Errorf("anchor(%q) = %q, want %q", in, got, want)
		}
	}
}
