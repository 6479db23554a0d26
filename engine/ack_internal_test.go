package engine

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// An admission passes only with everything asked for; what is missing is named.
func TestAckCheckNamesWhatIsMissing(t *testing.T) {
	both := ackPolicy{replicas: 1, timeout: time.Second, aofLocal: 1, aofReplicas: 1, aofTimeout: 2 * time.Second}
	if err := both.check(context.Background(), ackReplies{replicas: 1, aofSent: true, aofLocal: 1, aofReplicas: 2}); err != nil {
		t.Fatalf("everything acknowledged: %v, want nil", err)
	}
	for _, tc := range []struct {
		got  ackReplies
		says string
	}{
		{ackReplies{replicas: 0, aofSent: true, aofLocal: 1, aofReplicas: 1}, "0 of 1 replicas acknowledged it within 1s"},
		{ackReplies{replicas: 1, aofSent: true, aofLocal: 0, aofReplicas: 1}, "local append-only file 0 of 1, replicas 1 of 1"},
		{ackReplies{replicas: 1, aofSent: true, aofLocal: 1, aofReplicas: 0}, "within 2s: local append-only file 1 of 1, replicas 0 of 1"},
		{ackReplies{replicas: 1, aofLocal: 1, aofReplicas: 1}, "no WAITAOF followed its call"},
	} {
		if err := both.check(context.Background(), tc.got); !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("check(%+v) = %v, want ErrUnavailable saying %q", tc.got, err, tc.says)
		}
	}
	if err := both.check(context.Background(), ackReplies{err: errors.New("dial tcp: connection refused"), failed: "WAITAOF"}); !errors.Is(err, ErrUnavailable) ||
		!strings.HasPrefix(err.Error(), "WAITAOF: ") {
		t.Errorf("a WAITAOF that could not answer: %v, want ErrUnavailable starting with \"WAITAOF: \"", err)
	}
	for _, tc := range []struct {
		a                 ackPolicy
		on, wait, waitAOF bool
	}{
		{ackPolicy{}, false, false, false},
		{ackPolicy{replicas: 1}, true, true, false},
		{ackPolicy{aofReplicas: 1}, true, false, true},
		{ackPolicy{aofLocal: 1}, true, false, true},
	} {
		if on, wait, waitAOF := tc.a.on(), tc.a.wait(), tc.a.waitAOF(); on != tc.on || wait != tc.wait || waitAOF != tc.waitAOF {
			t.Errorf("%+v: on, wait, waitAOF = %v, %v, %v; want %v, %v, %v", tc.a, on, wait, waitAOF, tc.on, tc.wait, tc.waitAOF)
		}
	}
}
