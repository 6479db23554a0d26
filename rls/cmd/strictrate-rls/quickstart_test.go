package main

import (
	"context"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/strictrate/strictrate/internal/valkeytest"
	"github.com/strictrate/strictrate/rls/settings"
)

// quickStartDoc is the page whose first five minutes TestQuickStart runs.
const quickStartDoc = "../../../docs/rls.md"

// quickStart is what docs/rls.md's "The first five minutes" asks and expects, read from its
// code blocks, so that the page cannot drift from what the command does.
type quickStart struct {
	configPath, config string              // the file step 2 writes, and its text
	env                map[string]string   // the variables step 3 starts the command with
	httpURL, httpBody  string              // step 4's curl: where it posts, and the body
	httpAnswers        []jsonAnswer        // and the answers it shows, in order
	grpcAddr, grpcBody string              // step 5's grpcurl: where it calls, and the request
	grpcAnswer         string              // and the answer it shows, grpcurl's JSON
	logs               []map[string]string // the log lines steps 3 and 6 show
}

// jsonAnswer is one line of step 4's answers: the body, then the HTTP status.
type jsonAnswer struct {
	body   string
	status int
}

// fence is one fenced code block of a Markdown page: its info string ("sh") and its text.
type fence struct{ info, text string }

// fences are the fenced code blocks of the section of page headed heading, in order.
func fences(t *testing.T, page, heading string) []fence {
	t.Helper()
	_, section, ok := strings.Cut(page, "\n## "+heading+"\n")
	if !ok {
		t.Fatalf("%s has no section %q", quickStartDoc, heading)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var out []fence
	var open *fence
	for line := range strings.Lines(section) {
		switch {
		case open == nil && strings.HasPrefix(line, "```"):
			open = &fence{info: strings.TrimSpace(strings.TrimPrefix(line, "```"))}
		case open != nil && strings.TrimSpace(line) == "```":
			out = append(out, *open)
			open = nil
		case open != nil:
			open.text += line
		}
	}
	if open != nil {
		t.Fatalf("%s: a code block of %q is not closed", quickStartDoc, heading)
	}
	return out
}

// afterData is what follows "-d" in a command: the argument in single quotes ('{...}'), and
// the n words after it.
func afterData(t *testing.T, command string, n int) (string, []string) {
	t.Helper()
	m := regexp.MustCompile(`-d '([^']*)'((?: +\S+){` + strconv.Itoa(n) + `})`).FindStringSubmatch(command)
	if m == nil {
		t.Fatalf("%s: no -d '...' and %d words after it in %q", quickStartDoc, n, command)
	}
	return m[1], strings.Fields(m[2])
}

// readQuickStart reads the quick start out of docs/rls.md: the code blocks of its steps, each
// found by what it holds, and the answers in the block that follows a request's.
func readQuickStart(t *testing.T) quickStart {
	t.Helper()
	page, err := os.ReadFile(quickStartDoc)
	if err != nil {
		t.Fatal(err)
	}
	blocks := fences(t, string(page), "The first five minutes")
	var q quickStart
	for i, b := range blocks {
		next := func() string {
			if i+1 >= len(blocks) {
				t.Fatalf("%s: no answer follows %q", quickStartDoc, b.text)
			}
			return blocks[i+1].text
		}
		switch {
		case b.info == "sh" && strings.Contains(b.text, "<<'EOF'\n"):
			m := regexp.MustCompile(`cat > (\S+) <<'EOF'\n((?s:.*?))\nEOF\n`).FindStringSubmatch(b.text)
			if m == nil {
				t.Fatalf("%s: step 2's heredoc does not parse: %q", quickStartDoc, b.text)
			}
			q.configPath, q.config = m[1], m[2]+"\n"
		case b.info == "sh" && strings.Contains(b.text, "./strictrate-rls\n"):
			// The variables are the words of the command before the binary, across its
			// continued lines.
			command := strings.ReplaceAll(b.text, "\\\n", " ")
			q.env = map[string]string{}
			for line := range strings.Lines(command) {
				words := strings.Fields(line)
				if len(words) == 0 || words[len(words)-1] != "./strictrate-rls" {
					continue
				}
				for _, w := range words[:len(words)-1] {
					name, value, ok := strings.Cut(w, "=")
					if !ok {
						t.Fatalf("%s: %q in step 3's command is not NAME=value", quickStartDoc, w)
					}
					q.env[name] = value
				}
			}
		case b.info == "sh" && strings.Contains(b.text, "curl "):
			var words []string
			q.httpBody, words = afterData(t, b.text, 1)
			q.httpURL = words[0]
			for line := range strings.Lines(next()) {
				body, code, _ := strings.Cut(strings.TrimSpace(line), " ")
				status, err := strconv.Atoi(code)
				if err != nil {
					t.Fatalf("%s: step 4's answer %q does not end in an HTTP status", quickStartDoc, line)
				}
				q.httpAnswers = append(q.httpAnswers, jsonAnswer{body, status})
			}
			// The loop sends the request once for each answer shown.
			if m := regexp.MustCompile(`for i in ([^;]*); do`).FindStringSubmatch(b.text); m == nil || len(strings.Fields(m[1])) != len(q.httpAnswers) {
				t.Fatalf("%s: step 4's loop %q does not send one request for each of its %d answers", quickStartDoc, m, len(q.httpAnswers))
			}
		case b.info == "sh" && strings.Contains(b.text, "grpcurl\" -plaintext"):
			var words []string
			q.grpcBody, words = afterData(t, b.text, 2)
			q.grpcAddr = words[0]
			if method := words[1]; method != pb.RateLimitService_ServiceDesc.ServiceName+"/ShouldRateLimit" {
				t.Fatalf("%s: step 5 calls %q, not ShouldRateLimit", quickStartDoc, method)
			}
			q.grpcAnswer = next()
		case b.info == "text" && strings.Contains(b.text, " msg="):
			for line := range strings.Lines(b.text) {
				r := logRecord(line)
				if r == nil {
					t.Fatalf("%s: the log line %q does not parse", quickStartDoc, line)
				}
				q.logs = append(q.logs, r)
			}
		}
	}
	if q.config == "" || q.env == nil || q.httpBody == "" || len(q.httpAnswers) == 0 || q.grpcBody == "" || q.grpcAnswer == "" || len(q.logs) == 0 {
		t.Fatalf("%s: the quick start lacks a step: %+v", quickStartDoc, q)
	}
	return q
}

// durationUntilReset finds the durationUntilReset of a /json answer, to be compared apart.
var durationUntilReset = regexp.MustCompile(`"durationUntilReset":"([^"]*)"`)

// TestQuickStart runs docs/rls.md's first five minutes against the built command, from the
// page itself: the configuration step 2 writes (in a directory of the test's own, in the
// place the page's variables say), the command started with step 3's variables (on the test's
// Valkey and free ports, and with the test's key prefix), step 4's /json requests, which must
// answer what the page shows (the same bytes and statuses; durationUntilReset, which counts
// down from the first hit, must be the page's whole minute first, then no more than the one
// before), and step 5's gRPC request, answered as the page shows, by a server whose
// reflection describes the service as grpcurl asks for it; then step 6's Ctrl-C. The log
// lines the page shows must be logged, with the same attributes. The page's ports must be the
// defaults.
func TestQuickStart(t *testing.T) {
	valkeytest.SkipIfShort(t, "runs the strictrate-rls command as a process")
	t.Parallel()
	q := readQuickStart(t)
	defaults, _, err := settings.FromEnv(func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse("http://" + q.httpURL)
	if err != nil || u.Port() != strconv.Itoa(defaults.Port) || u.Path != "/json" {
		t.Errorf("step 4 posts to %q, want /json on the default PORT, %d", q.httpURL, defaults.Port)
	}
	if _, port, err := net.SplitHostPort(q.grpcAddr); err != nil || port != strconv.Itoa(defaults.GRPCPort) {
		t.Errorf("step 5 calls %q, want the default GRPC_PORT, %d", q.grpcAddr, defaults.GRPCPort)
	}

	// Step 2, in the test's directory: the page's RUNTIME_ROOT becomes it.
	root := t.TempDir()
	dir := filepath.Join(q.env["RUNTIME_ROOT"], q.env["RUNTIME_SUBDIRECTORY"], q.env["RUNTIME_APPDIRECTORY"])
	if filepath.Dir(q.configPath) != dir {
		t.Fatalf("step 2 writes %s, which step 3's RUNTIME_* do not read (%s)", q.configPath, dir)
	}
	rel, _ := filepath.Rel(q.env["RUNTIME_ROOT"], q.configPath)
	writeFile(t, filepath.Join(root, rel), q.config)

	// Step 3.
	e := baseEnv(t)
	for name, value := range q.env {
		switch name {
		case "REDIS_URL":
			// The test's Valkey.
		case "RUNTIME_ROOT":
			e[name] = root
		default:
			e[name] = value
		}
	}
	p := start(t, e)

	// Step 4.
	var before time.Duration // the last answer's durationUntilReset
	for i, want := range q.httpAnswers {
		code, body, err := post("http://"+p.http+u.Path, q.httpBody)
		if err != nil {
			t.Fatalf("request %d of step 4: %v", i+1, err)
		}
		gotDuration, wantDuration := durationUntilReset.FindStringSubmatch(body), durationUntilReset.FindStringSubmatch(want.body)
		if code != want.status || durationUntilReset.ReplaceAllString(body, "") != durationUntilReset.ReplaceAllString(want.body, "") ||
			(gotDuration == nil) != (wantDuration == nil) {
			t.Fatalf("request %d of step 4:\n%s %d\nwant (durationUntilReset aside):\n%s %d", i+1, body, code, want.body, want.status)
		}
		if gotDuration == nil {
			continue
		}
		got, err := time.ParseDuration(gotDuration[1])
		if err != nil {
			t.Fatalf("request %d of step 4: durationUntilReset %q: %v", i+1, gotDuration[1], err)
		}
		shown, err := time.ParseDuration(wantDuration[1])
		if err != nil {
			t.Fatalf("step 4's answer %d: durationUntilReset %q: %v", i+1, wantDuration[1], err)
		}
		// The page's first is exact (the whole window, from the hit just made); the others
		// depend on the time between requests, and count down from it.
		switch {
		case i == 0 && got != shown:
			t.Errorf("request 1 of step 4: durationUntilReset %v, want %v", got, shown)
		case i > 0 && (got <= 0 || got > before):
			t.Errorf("request %d of step 4: durationUntilReset %v, want above 0 and at most the last answer's %v (the page shows %v)", i+1, got, before, shown)
		}
		before = got
	}

	// Step 5: what grpcurl finds by reflection, then its call.
	conn, err := grpc.NewClient(p.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	checkReflection(t, conn)
	var req pb.RateLimitRequest
	if err := protojson.Unmarshal([]byte(q.grpcBody), &req); err != nil {
		t.Fatalf("step 5's request %q: %v", q.grpcBody, err)
	}
	var wantResp pb.RateLimitResponse
	if err := protojson.Unmarshal([]byte(q.grpcAnswer), &wantResp); err != nil {
		t.Fatalf("step 5's answer %q: %v", q.grpcAnswer, err)
	}
	got := respond(t, pb.NewRateLimitServiceClient(conn), &req)
	if !proto.Equal(got, &wantResp) {
		t.Errorf("step 5's call: %v, want the page's %v", got, &wantResp)
	}

	// Step 6's Ctrl-C; then the log lines the page shows, each with the same attributes (the
	// addresses, the directory and the times are the test's own).
	if err := p.run.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(drainTimeout + 2*time.Second); code != 0 {
		t.Errorf("exit code after Ctrl-C: %d, want 0", code)
	}
	out := p.log.String()
	for _, shown := range q.logs {
		r := findRecord(out, shown["msg"])
		if r == nil {
			t.Errorf("no log line %q, which the page shows", shown["msg"])
			continue
		}
		for k := range r {
			if _, ok := shown[k]; !ok {
				t.Errorf("the log line %q has %s, which the page does not show", shown["msg"], k)
			}
		}
		for k, v := range shown {
			got, ok := r[k]
			switch {
			case !ok:
				t.Errorf("the log line %q has no %s, which the page shows", shown["msg"], k)
			case k == "level" || k == "domains" || k == "rules" || k == "cause" || k == "drained":
				if got != v {
					t.Errorf("the log line %q: %s=%q, the page shows %q", shown["msg"], k, got, v)
				}
			}
		}
	}
}

// checkReflection asks conn's server reflection what grpcurl asks before a call: the services,
// which must include the rate limit service, and the file that describes it.
func checkReflection(t *testing.T, conn *grpc.ClientConn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatalf("server reflection: %v", err)
	}
	ask := func(req *reflectionpb.ServerReflectionRequest) *reflectionpb.ServerReflectionResponse {
		t.Helper()
		if err := stream.Send(req); err != nil {
			t.Fatalf("server reflection: %v", err)
		}
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("server reflection: %v", err)
		}
		return resp
	}
	name := pb.RateLimitService_ServiceDesc.ServiceName
	listed := false
	for _, s := range ask(&reflectionpb.ServerReflectionRequest{
		MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{},
	}).GetListServicesResponse().GetService() {
		listed = listed || s.GetName() == name
	}
	if !listed {
		t.Errorf("server reflection does not list %s", name)
	}
	files := ask(&reflectionpb.ServerReflectionRequest{
		MessageRequest: &reflectionpb.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: name},
	}).GetFileDescriptorResponse().GetFileDescriptorProto()
	if len(files) == 0 {
		t.Errorf("server reflection has no file describing %s", name)
	}
}
