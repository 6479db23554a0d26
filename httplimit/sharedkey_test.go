package httplimit_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/httplimit"
	"github.com/strictrate/strictrate/internal/enginetest"
)

// Two middlewares of different policies on one engine, with the default key prefix (a login
// limit and a search limit): each holds on its own requests. They used to share each client's
// key, and the search limit's short window trimmed what the login limit counted: 20 of 20
// logins went through a limit of 5 per hour.
func TestMiddlewaresOfDifferentPoliciesCountApart(t *testing.T) {
	e := enginetest.New(t, server.Client(t))
	login := httplimit.Limit(e, engine.PerHour(5))(ok)
	search := httplimit.Limit(e, engine.Limit{Max: 100, Window: 10 * time.Millisecond})(ok)
	client := "198.51.100.23:4000"
	logins, searches := 0, 0
	for i := 0; i < 20; i++ {
		if do(login, client, nil).Code == http.StatusOK {
			logins++
		}
		time.Sleep(12 * time.Millisecond)
		if do(search, client, nil).Code == http.StatusOK {
			searches++
		}
	}
	if logins != 5 || searches != 20 {
		t.Fatalf("%d logins and %d searches admitted, want 5 and 20", logins, searches)
	}
}
