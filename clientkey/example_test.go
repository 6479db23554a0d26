package clientkey_test

import (
	"errors"
	"fmt"

	"github.com/strictrate/strictrate/clientaddr"
	"github.com/strictrate/strictrate/clientkey"
	"github.com/strictrate/strictrate/engine"
)

// A limiter of your own keys clients as httplimit does: with httplimit's default prefix
// "http:" and the same policy, its engine key for a client is the middleware's, and the two
// share the client's count.
func Example() {
	errNoKey := errors.New("mylimit: no rate-limit key")
	policy := engine.Policy{engine.PerSecond(5), engine.PerHour(100)}
	prefix := clientkey.Prefix("http:", policy) // once, beside the policy

	resolver, err := clientaddr.New() // the peer's own address; no proxies trusted
	if err != nil {
		fmt.Println(err)
		return
	}
	// Per request: the client's key, then AllowPolicy(ctx, prefix+client, policy, 1).
	client, err := clientkey.FromAddr(errNoKey, resolver, "192.0.2.7:53211", nil, "key requests by user")
	fmt.Println(prefix+client, err)

	_, err = clientkey.Checked(errNoKey, "", nil) // an empty header value, say
	fmt.Println(err)
	// Output:
	// http:5/1000000,100/3600000000:192.0.2.7 <nil>
	// mylimit: no rate-limit key: empty key
}
