package transport

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/strictrate/strictrate/internal/callerr"
)

// An admission passes only with everything asked for; what is missing is named.
func TestAckCheckNamesWhatIsMissing(t *testing.T) {
	both := Ack{Replicas: 1, Timeout: time.Second, AOFLocal: 1, AOFReplicas: 1, AOFTimeout: 2 * time.Second}
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
		if err := both.check(context.Background(), tc.got); !errors.Is(err, callerr.ErrUnavailable) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("check(%+v) = %v, want ErrUnavailable saying %q", tc.got, err, tc.says)
		}
	}
	if err := both.check(context.Background(), ackReplies{err: errors.New("dial tcp: connection refused"), failed: "WAITAOF"}); !errors.Is(err, callerr.ErrUnavailable) ||
		!strings.HasPrefix(err.Error(), "WAITAOF: ") {
		t.Errorf("a WAITAOF that could not answer: %v, want ErrUnavailable starting with \"WAITAOF: \"", err)
	}
	for _, tc := range []struct {
		a                 Ack
		on, wait, waitAOF bool
	}{
		{Ack{}, false, false, false},
		{Ack{Replicas: 1}, true, true, false},
		{Ack{AOFReplicas: 1}, true, false, true},
		{Ack{AOFLocal: 1}, true, false, true},
	} {
		if on, wait, waitAOF := tc.a.On(), tc.a.wait(), tc.a.waitAOF(); on != tc.on || wait != tc.wait || waitAOF != tc.waitAOF {
			t.Errorf("%+v: on, wait, waitAOF = %v, %v, %v; want %v, %v, %v", tc.a, on, wait, waitAOF, tc.on, tc.wait, tc.waitAOF)
		}
	}
}
