package httplimit_test

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/httplimit"
)

// The examples connect to Valkey as a program would, each with a client of its own: at the
// address in VALKEY_ADDR (which examples/httpserver reads too), else 127.0.0.1:6379. TestMain
// sets VALKEY_ADDR to the tests' server (valkeytest starts a throwaway one unless VALKEY_ADDR
// already names a server), so that the examples run and their Output is checked. Each example
// keys its counts by a UUID prefix, so its output is the same on every run.

func ExampleNew() {
	// Valkey at $VALKEY_ADDR, else on this host's default port.
	client, err := valkey.NewClient(valkey.ClientOption{
		InitAddress: []string{cmp.Or(os.Getenv("VALKEY_ADDR"), "127.0.0.1:6379")},
	})
	if err != nil {
		panic(err)
	}
	defer client.Close()
	// A fixed clock makes the numbers below exact; by default the server's clock decides.
	noon := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	e, err := engine.New(client, engine.WithClock(func() time.Time { return noon }))
	if err != nil {
		panic(err)
	}

	hello := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "hello\n") })
	// 2 per second and 100 per hour for each client address.
	limit := httplimit.New(e, engine.Policy{engine.PerSecond(2), engine.PerHour(100)},
		httplimit.WithKeyPrefix("example:"+uuid.NewString()+":"))
	h := limit(hello)

	for i := 0; i < 3; i++ {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		if i == 0 {
			fmt.Println("RateLimit-Policy:", rec.Header().Get("RateLimit-Policy"))
		}
		fmt.Print(rec.Code, " RateLimit: ", rec.Header().Get("RateLimit"))
		if ra := rec.Header().Get("Retry-After"); ra != "" {
			fmt.Print(" Retry-After: ", ra)
		}
		fmt.Println()
	}
	// Output:
	// RateLimit-Policy: "1s";q=2;w=1, "1h";q=100;w=3600
	// 200 RateLimit: "1s";r=1;t=1
	// 200 RateLimit: "1s";r=0;t=1
	// 429 RateLimit: "1s";r=0;t=1 Retry-After: 1
}

func ExampleNewConcurrent() {
	// Valkey at $VALKEY_ADDR, else on this host's default port.
	client, err := valkey.NewClient(valkey.ClientOption{
		InitAddress: []string{cmp.Or(os.Getenv("VALKEY_ADDR"), "127.0.0.1:6379")},
	})
	if err != nil {
		panic(err)
	}
	defer client.Close()
	// A fixed clock makes the numbers below exact; by default the server's clock decides.
	noon := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	e, err := engine.New(client, engine.WithClock(func() time.Time { return noon }))
	if err != nil {
		panic(err)
	}

	// One export at a time per client address; leases of 30 s, extended while an export runs.
	var h http.Handler
	export := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A second request of the same client while this one runs:
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/export", nil))
		fmt.Println("meanwhile:", rec.Code, "Retry-After:", rec.Header().Get("Retry-After"),
			"RateLimit:", rec.Header().Get("RateLimit"))
		io.WriteString(w, "export\n")
	})
	h = httplimit.NewConcurrent(e, 1, 30*time.Second, httplimit.WithKeyPrefix("example:"+uuid.NewString()+":"))(export)

	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/export", nil))
	fmt.Println("RateLimit-Policy:", rec.Header().Get("RateLimit-Policy"))
	fmt.Println(rec.Code, "RateLimit:", rec.Header().Get("RateLimit"))
	// Output:
	// meanwhile: 429 Retry-After: 30 RateLimit: "concurrency";r=0;t=30
	// RateLimit-Policy: "concurrency";q=1;qu="concurrent-requests"
	// 200 RateLimit: "concurrency";r=0
}

// Counting failed logins: 5 per 15 minutes for each account and for each client address. Both
// limits count an attempt before the password is checked, so parallel guesses never pass 5;
// the address gets back what was not a failed login, and a successful login clears its
// account's failures (docs/http-grpc.md, "Counting failed logins").
func ExampleWithRefundOn() {
	// Valkey at $VALKEY_ADDR, else on this host's default port.
	client, err := valkey.NewClient(valkey.ClientOption{
		InitAddress: []string{cmp.Or(os.Getenv("VALKEY_ADDR"), "127.0.0.1:6379")},
	})
	if err != nil {
		panic(err)
	}
	defer client.Close()
	e, err := engine.New(client)
	if err != nil {
		panic(err)
	}
	prefix := "example:" + uuid.NewString() + ":"

	fiveIn15m := engine.Limit{Max: 5, Window: 15 * time.Minute}
	// Per address (the default key): a success, or the account limit's 429, is given back.
	perAddress := httplimit.Limit(e, fiveIn15m, httplimit.WithKeyPrefix(prefix+"login-address:"),
		httplimit.WithRefundOn(func(status int) bool { return status < 400 || status == http.StatusTooManyRequests }))
	// Per account: a successful login forgets the account's failures.
	perAccount := httplimit.Limit(e, fiveIn15m, httplimit.WithKeyPrefix(prefix+"login-account:"),
		httplimit.WithKeyFunc(func(r *http.Request) (string, error) {
			if account := r.PostFormValue("account"); account != "" {
				return strings.ToLower(account), nil
			}
			return "", errors.New("no account in the form")
		}),
		httplimit.WithResetOn(func(status int) bool { return status == http.StatusOK }))
	login := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.PostFormValue("password") != "right" { // check the account's password here
			http.Error(w, "wrong account or password", http.StatusUnauthorized)
			return
		}
		io.WriteString(w, "welcome\n")
	})
	h := perAddress(perAccount(login))

	attempt := func(from, account, password string) {
		form := url.Values{"account": {account}, "password": {password}}
		req := httptest.NewRequest(http.MethodPost, "/login", strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.RemoteAddr = from + ":40000"
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		fmt.Println(from, account, password, rec.Code)
	}
	for range 4 {
		attempt("192.0.2.1", "alice", "wrong")
	}
	attempt("192.0.2.1", "alice", "right") // alice's count is cleared; the address's stays at 4
	attempt("192.0.2.1", "bob", "wrong")   // the address's 5th failure
	attempt("192.0.2.1", "carol", "right") // the address is full: refused before its password is checked
	for i := 1; i <= 6; i++ {              // one account guessed from 6 addresses: the 6th is refused
		attempt(fmt.Sprintf("198.51.100.%d", i), "dave", "wrong")
	}
	// Output:
	// 192.0.2.1 alice wrong 401
	// 192.0.2.1 alice wrong 401
	// 192.0.2.1 alice wrong 401
	// 192.0.2.1 alice wrong 401
	// 192.0.2.1 alice right 200
	// 192.0.2.1 bob wrong 401
	// 192.0.2.1 carol right 429
	// 198.51.100.1 dave wrong 401
	// 198.51.100.2 dave wrong 401
	// 198.51.100.3 dave wrong 401
	// 198.51.100.4 dave wrong 401
	// 198.51.100.5 dave wrong 401
	// 198.51.100.6 dave wrong 429
}
