package engine

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// The engine's metrics, through the OpenTelemetry metric API (WithMeterProvider). OpenTelemetry
// has no convention for rate limiters; these are the names (docs/production.md has the table):
//
//	strictrate.decisions            counter    {decision}  every decision, by operation and outcome
//	strictrate.decision.duration    histogram  s           the call's time, queueing included
//	strictrate.batch.size           histogram  {decision}  decisions per script call (WithBatching)
//	strictrate.local.reservations   counter    {reservation}  reservations taken (WithLocalQuota)
//	strictrate.local.events         counter    {event}     events reserved, used and given back
//
// Attributes: strictrate.operation (allow: Allow, AllowN, Record, Wait; policy: AllowPolicy;
// allow_all: AllowAll; peek: Peek, PeekPolicy, Check; refund and settle: Refund and Settle;
// acquire, extend and release: the lease calls) and, on the first two, strictrate.outcome
// (allowed, denied, error, fail_open, shadow_denied, cache_denied; for leases: allowed when
// granted, extended or released, denied when the key was full, the lease had expired or there
// was none to release; for refund and settle: allowed when given back, error when not). The
// give-backs the engine makes on its own (AllowAll's refunds, local quota's settles) are not
// counted: the metrics count callers' calls. On strictrate.local.events, strictrate.local
// (reserved, used: admitted from a reservation, returned: given back unused). Never the key:
// keys are unbounded.
const (
	meterName = "github.com/strictrate/strictrate/engine"

	metricDecisions = "strictrate.decisions"
	metricDuration  = "strictrate.decision.duration"
	metricBatchSize = "strictrate.batch.size"
	metricLocalRes  = "strictrate.local.reservations"
	metricLocalEvts = "strictrate.local.events"
	attrLocal       = "strictrate.local"

	attrOperation = "strictrate.operation"
	attrOutcome   = "strictrate.outcome"
)

// operation is what a decision was asked through.
type operation int

const (
	opAllow operation = iota
	opPolicy
	opAllowAll
	opPeek
	opRefund
	opSettle
	opAcquire
	opExtend
	opRelease
	opCharge
	numOperations
)

// operationNames are the operations as strictrate.operation names them.
var operationNames = [numOperations]string{"allow", "policy", "allow_all", "peek", "refund", "settle", "acquire", "extend", "release", "charge"}

// metricOutcome is how a call ended, as the metrics count it.
type metricOutcome int

const (
	outcomeAllowed metricOutcome = iota
	outcomeDenied
	outcomeError
	outcomeFailOpen
	outcomeShadowDenied
	outcomeCacheDenied
	numOutcomes
)

// outcomeNames are the outcomes as strictrate.outcome names them.
var outcomeNames = [numOutcomes]string{"allowed", "denied", "error", "fail_open", "shadow_denied", "cache_denied"}

// metrics holds the engine's instruments and their attribute sets, made once (as option
// slices, so that recording allocates nothing).
type metrics struct {
	decisions metric.Int64Counter
	duration  metric.Float64Histogram
	batchSize metric.Int64Histogram
	added     [numOperations][numOutcomes][]metric.AddOption
	recorded  [numOperations][numOutcomes][]metric.RecordOption
	byOp      [numOperations][]metric.RecordOption

	localReservations                       metric.Int64Counter
	localEvents                             metric.Int64Counter
	localReserved, localUsed, localReturned []metric.AddOption
}

// called is the batch-size metric's count of a call of n requests of op
// (transport.Kind.Called).
func (m *metrics) called(op operation) func(ctx context.Context, n int) {
	return func(ctx context.Context, n int) { m.batchSize.Record(ctx, int64(n), m.byOp[op]...) }
}

// newMetrics makes the engine's instruments on mp (the global provider when nil), and every
// attribute set they are recorded with.
func newMetrics(mp metric.MeterProvider) (*metrics, error) {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	meter := mp.Meter(meterName)
	m := &metrics{}
	var err error
	if m.decisions, err = meter.Int64Counter(metricDecisions, metric.WithUnit("{decision}"),
		metric.WithDescription("Rate-limit decisions, by operation and outcome.")); err != nil {
		return nil, err
	}
	if m.duration, err = meter.Float64Histogram(metricDuration, metric.WithUnit("s"),
		metric.WithDescription("Time a decision took the caller, queueing for a batch included."),
		metric.WithExplicitBucketBoundaries(0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1)); err != nil {
		return nil, err
	}
	if m.batchSize, err = meter.Int64Histogram(metricBatchSize, metric.WithUnit("{decision}"),
		metric.WithDescription("Decisions per script call, under group commit."),
		metric.WithExplicitBucketBoundaries(1, 2, 4, 8, 16, 32, 64, 128)); err != nil {
		return nil, err
	}
	if m.localReservations, err = meter.Int64Counter(metricLocalRes, metric.WithUnit("{reservation}"),
		metric.WithDescription("Local quota's reservations taken.")); err != nil {
		return nil, err
	}
	if m.localEvents, err = meter.Int64Counter(metricLocalEvts, metric.WithUnit("{event}"),
		metric.WithDescription("Local quota's events: reserved, used (admitted from a reservation) and returned (given back unused).")); err != nil {
		return nil, err
	}
	local := func(kind string) []metric.AddOption {
		return []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(attribute.String(attrLocal, kind)))}
	}
	m.localReserved, m.localUsed, m.localReturned = local("reserved"), local("used"), local("returned")
	for op := range numOperations {
		opAttr := attribute.String(attrOperation, operationNames[op])
		m.byOp[op] = []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(opAttr))}
		for oc := range numOutcomes {
			set := metric.WithAttributeSet(attribute.NewSet(opAttr, attribute.String(attrOutcome, outcomeNames[oc])))
			m.added[op][oc] = []metric.AddOption{set}
			m.recorded[op][oc] = []metric.RecordOption{set}
		}
	}
	return m, nil
}
