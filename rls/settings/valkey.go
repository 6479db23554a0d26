package settings

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"

	"github.com/valkey-io/valkey-go"
)

// ValkeyOption returns the options of the Valkey client the engine decides with:
//
//   - REDIS_TYPE=SINGLE: the one server of REDIS_URL, as a single client (never switched to
//     cluster mode), over REDIS_SOCKET_TYPE (tcp, or unix with REDIS_URL the socket's path);
//   - CLUSTER: REDIS_URL's comma-separated nodes as seeds; the client learns the others;
//   - SENTINEL: REDIS_URL is the master set's name and then the sentinels' addresses, and
//     REDIS_SENTINEL_AUTH the sentinels' own credentials.
//
// An address may be a URL, redis://[user[:password]@]host:port[/db][?username=&password=&db=],
// as the reference's client reads it; REDIS_AUTH (password, or user:password) wins over the
// URL's credentials. REDIS_TLS secures every connection (RedisTLS), REDIS_TIMEOUT bounds
// dialing and each write, and REDIS_PIPELINE_WINDOW becomes the client's MaxFlushDelay.
func (s Settings) ValkeyOption() (valkey.ClientOption, error) {
	t, _, err := s.redisTarget(false)
	if err != nil {
		return valkey.ClientOption{}, err
	}
	tlsConfig, err := s.RedisTLS()
	if err != nil {
		return valkey.ClientOption{}, err
	}
	opt := valkey.ClientOption{
		InitAddress:      t.addrs,
		Username:         t.username,
		Password:         t.password,
		SelectDB:         t.db,
		TLSConfig:        tlsConfig,
		Dialer:           net.Dialer{Timeout: s.RedisTimeout},
		ConnWriteTimeout: s.RedisTimeout,
		MaxFlushDelay:    s.RedisPipelineWindow,
		// The engine never reads through the client-side cache; without it, connections
		// skip CLIENT TRACKING.
		DisableCache: true,
	}
	switch s.RedisType {
	case RedisSingle:
		opt.ForceSingleClient = true
		if t.network != "tcp" {
			opt.DialCtxFn = dialNetwork(t.network)
		}
	case RedisSentinel:
		opt.Sentinel = valkey.SentinelOption{
			MasterSet: t.masterSet,
			Username:  t.sentinelUsername,
			Password:  t.sentinelPassword,
			TLSConfig: tlsConfig,
			Dialer:    opt.Dialer,
		}
	}
	return opt, nil
}

// dialNetwork dials over network (unix, tcp4 or tcp6) where valkey-go dials tcp. Over a unix
// socket, TLS verifies the name in the configuration's ServerName, as there is no host to
// take it from (or only the chain, with REDIS_TLS_SKIP_HOSTNAME_VERIFICATION).
func dialNetwork(network string) func(context.Context, string, *net.Dialer, *tls.Config) (net.Conn, error) {
	return func(ctx context.Context, addr string, d *net.Dialer, cfg *tls.Config) (net.Conn, error) {
		if cfg == nil {
			return d.DialContext(ctx, network, addr)
		}
		if network != "unix" {
			td := &tls.Dialer{NetDialer: d, Config: cfg}
			return td.DialContext(ctx, network, addr)
		}
		conn, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		tc := tls.Client(conn, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			conn.Close()
			return nil, err
		}
		return tc, nil
	}
}

// redisTarget is what REDIS_URL and the credentials say to connect to.
type redisTarget struct {
	network   string   // SINGLE's REDIS_SOCKET_TYPE; tcp otherwise
	addrs     []string // SINGLE: its one; CLUSTER: the seeds; SENTINEL: the sentinels
	masterSet string   // SENTINEL

	username, password                 string // the servers'
	sentinelUsername, sentinelPassword string
	db                                 int
}

// redisAddress is one address of REDIS_URL, with what its URL form carries.
type redisAddress struct {
	addr               string
	username, password string
	db                 int
}

// redisTarget parses REDIS_URL for REDIS_TYPE and REDIS_SOCKET_TYPE, and combines the
// credentials. It returns warnings for what the reference ignores without a word;
// socketTypeSet says whether REDIS_SOCKET_TYPE was set, so that its default draws none.
func (s Settings) redisTarget(socketTypeSet bool) (redisTarget, []string, error) {
	var (
		t        redisTarget
		warnings []string
	)
	entries := strings.Split(s.RedisURL, ",")
	for i := range entries {
		entries[i] = strings.TrimSpace(entries[i])
	}
	switch s.RedisType {
	case RedisSentinel:
		if len(entries) < 2 || entries[0] == "" {
			return t, nil, fmt.Errorf("%w: REDIS_TYPE=SENTINEL: REDIS_URL is the master set's name and then the sentinels' addresses (name,host:port,...)", ErrInvalid)
		}
		t.masterSet, entries = entries[0], entries[1:]
	case RedisSingle:
		if len(entries) != 1 {
			return t, nil, fmt.Errorf("%w: REDIS_TYPE=SINGLE takes one address in REDIS_URL, not %d (for a cluster, REDIS_TYPE=CLUSTER)", ErrInvalid, len(entries))
		}
	}
	t.network = s.RedisSocketType
	if s.RedisType != RedisSingle {
		if socketTypeSet && t.network != "tcp" {
			warnings = append(warnings, fmt.Sprintf("REDIS_SOCKET_TYPE=%s is ignored with REDIS_TYPE=%s: cluster nodes and sentinels are reached over TCP", t.network, s.RedisType))
		}
		t.network = "tcp"
	}

	var fromURL *redisAddress // the credentials and database of the first address
	for i, e := range entries {
		if e == "" {
			return t, nil, fmt.Errorf("%w: REDIS_URL's address %d is empty", ErrInvalid, i+1)
		}
		if t.network == "unix" {
			if strings.Contains(e, "://") {
				return t, nil, fmt.Errorf("%w: REDIS_SOCKET_TYPE=unix: REDIS_URL is the socket's path, not %s", ErrInvalid, redact(e))
			}
			t.addrs = append(t.addrs, e)
			continue
		}
		a, err := parseRedisAddress(e)
		if err != nil {
			return t, nil, err
		}
		if fromURL == nil {
			fromURL = &a
		} else if a.username != fromURL.username || a.password != fromURL.password || a.db != fromURL.db {
			return t, nil, fmt.Errorf("%w: REDIS_URL's addresses carry different credentials or databases; one client has one of each", ErrInvalid)
		}
		t.addrs = append(t.addrs, a.addr)
	}
	if fromURL == nil {
		fromURL = &redisAddress{}
	}

	user, password := splitAuth(s.RedisAuth)
	if s.RedisType == RedisSentinel {
		// The sentinels' URLs authenticate to the sentinels, as the reference's sentinel
		// dialer reads them; the master's address comes from the sentinels, plain.
		t.username, t.password = user, password
		sUser, sPassword := splitAuth(s.RedisSentinelAuth)
		t.sentinelUsername, t.sentinelPassword = or(sUser, fromURL.username), or(sPassword, fromURL.password)
		if fromURL.db != 0 {
			warnings = append(warnings, "REDIS_URL: the database of the sentinels' URLs is ignored, as the reference ignores it: the master is used with database 0")
		}
		return t, warnings, nil
	}
	t.username, t.password = or(user, fromURL.username), or(password, fromURL.password)
	t.db = fromURL.db
	return t, warnings, nil
}

// parseRedisAddress reads host:port, or a redis:// URL as the reference's client (radix)
// does: user and password from the URL's user info or its username and password parameters,
// the database from its path or its db parameter.
func parseRedisAddress(e string) (redisAddress, error) {
	var a redisAddress
	host := e
	if strings.HasPrefix(e, "redis://") {
		u, err := url.Parse(e)
		if err != nil {
			return a, fmt.Errorf("%w: REDIS_URL: %s is not a URL", ErrInvalid, redact(e))
		}
		q := u.Query()
		a.username = or(u.User.Username(), q.Get("username"))
		a.password = q.Get("password")
		if p, ok := u.User.Password(); ok {
			a.password = p
		}
		db := q.Get("db")
		if u.Path != "" && u.Path != "/" {
			db = u.Path[1:]
		}
		if db != "" {
			n, err := strconv.Atoi(db)
			if err != nil || n < 0 {
				return a, fmt.Errorf("%w: REDIS_URL: %q in %s is not a database number", ErrInvalid, db, redact(e))
			}
			a.db = n
		}
		host = u.Host
	} else if strings.Contains(e, "://") {
		return a, fmt.Errorf("%w: REDIS_URL: %s: the only URL scheme is redis:// (for TLS, REDIS_TLS=true)", ErrInvalid, redact(e))
	}
	if _, _, err := net.SplitHostPort(host); err != nil {
		return a, fmt.Errorf("%w: REDIS_URL: %s is not host:port or redis://host:port", ErrInvalid, redact(e))
	}
	a.addr = host
	return a, nil
}

// splitAuth reads REDIS_AUTH as the reference does: user:password, or a password alone.
func splitAuth(auth string) (user, password string) {
	if auth == "" {
		return "", ""
	}
	if u, p, found := strings.Cut(auth, ":"); found {
		return u, p
	}
	return "", auth
}

// redact hides a URL's user info, so that an error never prints a password.
func redact(e string) string {
	if u, err := url.Parse(e); err == nil && u.User != nil {
		u.User = url.User("*****")
		return u.String()
	}
	if at := strings.LastIndex(e, "@"); at >= 0 {
		return "*****" + e[at:]
	}
	return e
}

func or(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
