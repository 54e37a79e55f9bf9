package oncommitotel

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/oncommit/oncommit/outbox"
)

// ScopeName is the instrumentation scope of the tracer and the meter.
const ScopeName = "github.com/oncommit/oncommit/otel"

// System is the value of messaging.system on every span and metric.
const System = "oncommit"

// KeyConsumerGroup names the subscriber of a copy (outbox
// Config.Subscribers) on process spans, on the queue gauges and on the
// retry and dead-letter counters; the other process metrics count a
// topic's subscribers together.
const KeyConsumerGroup = attribute.Key("messaging.consumer.group.name")

// Attribute keys. The messaging.* and error.type keys are those of the
// OpenTelemetry semantic conventions for messaging; the oncommit.* keys
// are this package's own.
const (
	KeySystem          = attribute.Key("messaging.system")
	KeyDestination     = attribute.Key("messaging.destination.name")
	KeyOperationName   = attribute.Key("messaging.operation.name")
	KeyOperationType   = attribute.Key("messaging.operation.type")
	KeyMessageID       = attribute.Key("messaging.message.id")
	KeyBatchCount      = attribute.Key("messaging.batch.message_count")
	KeyErrorType       = attribute.Key("error.type")
	KeyAttempt         = attribute.Key("oncommit.attempt")
	KeyOutcome         = attribute.Key("oncommit.outcome")
	KeyDuplicate       = attribute.Key("oncommit.duplicate")
	KeyDeadReason      = attribute.Key("oncommit.dead_letter.reason")
	KeyState           = attribute.Key("oncommit.state")
	KeyFencedOff       = attribute.Key("oncommit.fenced_off")
	KeyCarriedByClaim  = attribute.Key("oncommit.carried_by_claim")
	KeyListenerState   = attribute.Key("oncommit.listener.state")
	otherErrorType     = "_OTHER"
	operationCreate    = "create"
	operationSend      = "send"
	operationProcess   = "process"
	operationClaim     = "claim"
	operationSettle    = "settle"
	operationReceive   = "receive"
	operationTypeSettl = "settle"
)

// Metric names.
const (
	MetricSent              = "messaging.client.sent.messages"
	MetricConsumed          = "messaging.client.consumed.messages"
	MetricProcessDuration   = "messaging.process.duration"
	MetricOperationDuration = "messaging.client.operation.duration"
	MetricDeadLettered      = "oncommit.messages.dead_lettered"
	MetricRetried           = "oncommit.messages.retried"
	MetricLeasesLost        = "oncommit.leases.lost"
	MetricFencedOff         = "oncommit.settles.fenced_off"
	MetricListenerDown      = "oncommit.listener.disconnects"
	MetricQueueMessages     = "oncommit.queue.messages"
	MetricQueueOldestAge    = "oncommit.queue.oldest_due.age"
	// The queue gauges of ordered delivery, reported for an Outbox with
	// OrderByKey.
	MetricQueueKeys             = "oncommit.queue.keys"
	MetricQueueOldestBlockedAge = "oncommit.queue.oldest_blocked_key.age"
)

// Config configures a [Telemetry]. The zero value works.
type Config struct {
	// TracerProvider makes the tracer. Defaults to otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// MeterProvider makes the meter. Defaults to otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// Propagator writes the creation context into each message's headers
	// and reads it back at delivery. Defaults to the W3C trace context
	// and baggage (traceparent, tracestate, baggage).
	Propagator propagation.TextMapPropagator
	// ProcessAsChild makes each process span a child of the span that
	// created the message (it still links to it), so a request's trace
	// shows its deliveries. Defaults to false: the process span starts a
	// trace of its own and links to the creation span, as the messaging
	// conventions advise (a delivery can come much later, retried many
	// times).
	ProcessAsChild bool
	// ClaimSpans and SettleSpans make a CLIENT span per claim and per
	// write of outcomes. Default to false: their durations are metrics.
	ClaimSpans  bool
	SettleSpans bool
	// SampledContextOnly writes a message's trace context (traceparent and
	// tracestate, or what Propagator writes for a span context) only when
	// its create span is sampled; baggage is written either way. A message
	// whose create span was not sampled then carries no trace context,
	// and its row and every claim of it are that much smaller: the context
	// is about 80 bytes of each row, which a relay's claim rewrites and
	// reads back (docs/benchmarks.md measures a no-op drain of messages
	// that carry it at 0.82x-0.90x of one without, on a 2-core host). What
	// is lost: its process span (which starts
	// a trace of its own unless ProcessAsChild) has no link to the unsampled
	// create span, and a consumer downstream of a forwarder, or a process
	// span with ProcessAsChild, no longer sees the "not sampled" decision
	// and samples the message as a root by its own sampler. Defaults to
	// false: the context is written for every message, as the W3C trace
	// context asks.
	SampledContextOnly bool
	// SamplingAttributes gives the sampler a process span's messaging
	// attributes (messaging.system, messaging.destination.name,
	// messaging.operation.name and .type) when the span starts, as the
	// messaging conventions advise for samplers that decide by
	// attributes. Defaults to false: the span starts with its kind and
	// name only, and gets its attributes right after Start when it
	// records, which saves a sampled delivery two allocations and about
	// 640 bytes (docs/observability.md, "What it costs"). The exported
	// spans carry the same attributes either way; only a sampler of the
	// caller's that reads attributes at Start (AlwaysSample, NeverSample,
	// TraceIDRatioBased, and ParentBased over those, do not), or a
	// SpanProcessor whose OnStart reads or sets attributes, needs it:
	// OnStart runs before the attributes are set, and on a key both set
	// the relay's value wins. With ProcessAsChild or a Propagator of the
	// caller's, the sampler sees every attribute either way.
	SamplingAttributes bool
}

// Telemetry turns oncommit's hooks into OpenTelemetry spans and metrics.
// It is an [outbox.PublishHook] (set it as outbox.Config.Hook) and an
// [outbox.RelayObserver] (set it as outbox.RelayConfig.Observer); one
// Telemetry may serve several Outboxes and Relays. [Telemetry.ObserveQueue]
// adds the queue gauges. It is safe for concurrent use.
type Telemetry struct {
	cfg    Config
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
	// defaultProp: prop is the default (W3C trace context and baggage).
	defaultProp bool

	dead, retried, leases, fenced, listenerDown metric.Int64Counter
	// sent and consumed, one per published and delivered message, are
	// counted here and read by the SDK at collection.
	sent, consumed    countedSum
	processDur, opDur metric.Float64Histogram

	// attrs holds each attribute set's measurement options; starts, per
	// topic, the name and first options of its process spans. Both are
	// read on every delivery by every worker, so they are copy-on-write
	// maps: a read is an atomic load, with no lock word shared by the
	// workers' cores.
	attrs  cowMap[attrKey, *measureOpts]
	starts cowMap[string, *processStart]
	// copiers records, per span type, whether its SetAttributes copies
	// the slice it is given (see copiesAttributes).
	copiers cowMap[reflect.Type, bool]

	queue queueState
}

// measureOpts are one attribute set's options, as the slices Add and
// Record take: passing a slice that exists allocates nothing per call.
type measureOpts struct {
	add    []metric.AddOption
	record []metric.RecordOption
}

// attrKey names one attribute set of the metrics.
type attrKey struct {
	topic, op, errType string
	extraKey           attribute.Key
	extra              string
	group              string // KeyConsumerGroup, "" for none
}

var (
	_ outbox.PublishHook   = (*Telemetry)(nil)
	_ outbox.RelayObserver = (*Telemetry)(nil)
)

// New returns a Telemetry with its instruments made.
func New(cfg Config) (*Telemetry, error) {
	if cfg.TracerProvider == nil {
		cfg.TracerProvider = otel.GetTracerProvider()
	}
	if cfg.MeterProvider == nil {
		cfg.MeterProvider = otel.GetMeterProvider()
	}
	defaultProp := cfg.Propagator == nil
	if defaultProp {
		cfg.Propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	}
	t := &Telemetry{
		cfg:    cfg,
		tracer: cfg.TracerProvider.Tracer(ScopeName),
		prop:   cfg.Propagator,
		// With the default propagator, HandlerStart tells from the
		// headers' names what it must read.
		defaultProp: defaultProp,
	}
	m := cfg.MeterProvider.Meter(ScopeName)
	var errs []error
	counter := func(name, unit, desc string) metric.Int64Counter {
		c, err := m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	errs = append(errs, countedSums(m,
		countedSumSpec{&t.sent, MetricSent, "{message}", "Messages published (stored in the outbox table by the caller's transaction)."},
		countedSumSpec{&t.consumed, MetricConsumed, "{message}", "Messages delivered to a handler."}))
	t.dead = counter(MetricDeadLettered, "{message}", "Messages dead-lettered.")
	t.retried = counter(MetricRetried, "{message}", "Handler failures rescheduled for another attempt.")
	t.leases = counter(MetricLeasesLost, "{lease}", "Leases lost while a handler ran: another claim took the message.")
	t.fenced = counter(MetricFencedOff, "{message}", "Outcomes not written because another claim had taken the message.")
	t.listenerDown = counter(MetricListenerDown, "{disconnect}", "Wake-up listener connections lost.")
	// Buckets for durations in seconds from a millisecond to a minute:
	// the conventions' default buckets stop at 10 s, short of slow
	// handlers.
	buckets := metric.WithExplicitBucketBoundaries(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
	var err error
	t.processDur, err = m.Float64Histogram(MetricProcessDuration, metric.WithUnit("s"), buckets,
		metric.WithDescription("Duration of handler runs."))
	errs = append(errs, err)
	t.opDur, err = m.Float64Histogram(MetricOperationDuration, metric.WithUnit("s"), buckets,
		metric.WithDescription("Duration of the relay's claim and settle statements."))
	errs = append(errs, err)
	if err := t.queue.init(t, m); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("oncommitotel: %w", err)
	}
	return t, nil
}

// opts returns the measurement option for k, made once.
func (t *Telemetry) opts(k attrKey) *measureOpts {
	return t.attrs.get(k, func() *measureOpts { return makeOpts(k) })
}

// makeOpts makes the measurement options of k.
func makeOpts(k attrKey) *measureOpts {
	set := metric.WithAttributeSet(attrSet(k))
	return &measureOpts{add: []metric.AddOption{set}, record: []metric.RecordOption{set}}
}

// attrSet is the attribute set k names.
func attrSet(k attrKey) attribute.Set {
	kv := []attribute.KeyValue{KeySystem.String(System)}
	if k.topic != "" {
		kv = append(kv, KeyDestination.String(k.topic))
	}
	if k.op != "" {
		kv = append(kv, KeyOperationName.String(k.op))
	}
	if k.errType != "" {
		kv = append(kv, KeyErrorType.String(k.errType))
	}
	if k.extra != "" {
		kv = append(kv, k.extraKey.String(k.extra))
	}
	if k.group != "" {
		kv = append(kv, KeyConsumerGroup.String(k.group))
	}
	return attribute.NewSet(kv...)
}

// errorType is the error.type of err: its Go type, the convention for
// errors without a code, "" for nil.
func errorType(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	}
	var dl *outbox.DeadLetterError
	if errors.As(err, &dl) {
		return "dead_letter"
	}
	var re *outbox.RetryError
	if errors.As(err, &re) {
		return "retry_requested"
	}
	if s := fmt.Sprintf("%T", err); s != "" {
		return s
	}
	return otherErrorType
}

// fail records err on span.
func fail(span trace.Span, err error, errType string) {
	span.RecordError(err)
	span.SetStatus(codes.Error, err.Error())
	span.SetAttributes(KeyErrorType.String(errType))
}

// PublishStart starts the PRODUCER create span of m and writes its
// context into m's headers. It implements [outbox.PublishHook].
func (t *Telemetry) PublishStart(ctx context.Context, m *outbox.Message) context.Context {
	ctx, _ = t.tracer.Start(ctx, operationCreate+" "+m.Topic,
		trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(KeySystem.String(System), KeyDestination.String(m.Topic),
			KeyOperationName.String(operationCreate), KeyOperationType.String(operationCreate)))
	injectCtx := ctx
	if t.cfg.SampledContextOnly && !trace.SpanContextFromContext(ctx).IsSampled() {
		// No span context to write: the propagators write baggage only.
		injectCtx = trace.ContextWithSpanContext(ctx, trace.SpanContext{})
	}
	t.prop.Inject(injectCtx, (*lazyCarrier)(&m.Headers))
	return ctx
}

// lazyCarrier is a TextMapCarrier over a message's headers that makes the
// map at its first Set: a message given nothing to carry keeps nil
// headers (stored as NULL, with nothing to decode at delivery).
type lazyCarrier map[string]string

func (c *lazyCarrier) Get(key string) string { return (*c)[key] }

func (c *lazyCarrier) Set(key, value string) {
	if *c == nil {
		*c = make(map[string]string, 2)
	}
	(*c)[key] = value
}

func (c *lazyCarrier) Keys() []string { return propagation.MapCarrier(*c).Keys() }

// PublishEnd ends the create spans with the messages' ids (or the error),
// counts the messages sent and, for a batch, records a send span linking
// the create spans. It implements [outbox.PublishHook].
func (t *Telemetry) PublishEnd(ctx context.Context, e outbox.PublishEvent) {
	errType := errorType(e.Err)
	var links []trace.Link
	if len(e.Messages) > 1 {
		links = make([]trace.Link, 0, len(e.Messages))
	}
	topic := ""
	for i := range e.Messages {
		m := &e.Messages[i]
		span := trace.SpanFromContext(e.Contexts[i])
		if e.Err != nil {
			fail(span, e.Err, errType)
		} else if r := e.Results[i]; r.Duplicate {
			span.SetAttributes(KeyDuplicate.Bool(true))
		} else {
			span.SetAttributes(KeyMessageID.String(r.ID.String()))
		}
		span.End()
		if e.Err == nil && e.Results[i].Duplicate {
			continue // not stored: not sent
		}
		t.sent.count(attrKey{topic: m.Topic, op: operationCreate, errType: errType}).n.Add(1)
		if links != nil {
			links = append(links, trace.Link{SpanContext: span.SpanContext()})
		}
		if i == 0 {
			topic = m.Topic
		} else if m.Topic != topic {
			topic = ""
		}
	}
	if links == nil {
		return
	}
	kv := []attribute.KeyValue{KeySystem.String(System), KeyOperationName.String(operationSend),
		KeyOperationType.String(operationSend), KeyBatchCount.Int(len(e.Messages))}
	if topic != "" {
		kv = append(kv, KeyDestination.String(topic))
	}
	name := operationSend
	if topic != "" {
		name += " " + topic
	}
	_, span := t.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithLinks(links...), trace.WithAttributes(kv...))
	if e.Err != nil {
		fail(span, e.Err, errType)
	}
	span.End()
}

// HandlerStart starts the CONSUMER process span of a delivery, linked to
// the span that created the message (a child of it with
// Config.ProcessAsChild), and counts the delivery. The handler's context
// carries the span and the message's baggage. It implements
// [outbox.RelayObserver].
//
// With the default propagator and without ProcessAsChild, a process span
// starts a trace of its own, so the sampler decides it from its name and
// kind (and the topic's messaging attributes with
// Config.SamplingAttributes); the attributes and the link to the creation
// span are added only to spans that record, and an unsampled delivery
// pays for one span start, not for reading its trace context. With
// ProcessAsChild or a Config.Propagator of the caller's, the headers are
// read first, for every delivery, and the sampler sees it all.
func (t *Telemetry) HandlerStart(ctx context.Context, d outbox.Delivery) context.Context {
	ps := t.processStart(d.Topic)
	if t.cfg.ProcessAsChild || !t.defaultProp {
		return t.fullStart(ctx, d, ps)
	}
	var remote context.Context // the headers' context, once read
	opts := ps.opts
	if trace.SpanContextFromContext(ctx).IsValid() {
		// The relay's context carries a span (Run was called in one):
		// the process span must not be its child. Without one, the
		// span is a root anyway, and WithNewRoot would cost the SDK two
		// allocations.
		opts = ps.root
	}
	ctx, span := t.tracer.Start(ctx, ps.name, opts...)
	if span.IsRecording() {
		t.setProcessAttrs(span, ps, &d)
		sc, ok := traceparent(d.Headers)
		if !ok && len(d.Headers) > 0 {
			remote = t.extract(d.Headers)
			sc = trace.SpanContextFromContext(remote)
		}
		if sc.IsValid() {
			span.AddLink(trace.Link{SpanContext: sc})
		}
	}
	if remote == nil {
		if _, ok := d.Headers[headerBaggage]; ok {
			remote = t.extract(d.Headers)
		}
	}
	if remote != nil {
		if b := baggage.FromContext(remote); b.Len() > 0 {
			ctx = baggage.ContextWithBaggage(ctx, b)
		}
	}
	ps.consumed.n.Add(1)
	return ctx
}

// extract reads the propagated context of a message's headers.
func (t *Telemetry) extract(h map[string]string) context.Context {
	return t.prop.Extract(context.Background(), propagation.MapCarrier(h))
}

// fullStart is HandlerStart with Config.ProcessAsChild (the process span
// is a child of the creation span) or a Config.Propagator of the caller's
// (whatever it extracts reaches the handler's context): the headers are
// read into the context first, for every delivery.
func (t *Telemetry) fullStart(ctx context.Context, d outbox.Delivery, ps *processStart) context.Context {
	// The sampler sees every attribute here: the headers are read first
	// anyway.
	kv := make([]attribute.KeyValue, 0, len(ps.attrs)+3)
	kv = append(append(kv, ps.attrs[:]...), KeyMessageID.String(d.ID.String()), KeyAttempt.Int(d.Attempt))
	if d.Subscriber != "" {
		kv = append(kv, KeyConsumerGroup.String(d.Subscriber))
	}
	opts := make([]trace.SpanStartOption, 0, 4)
	opts = append(opts, ps.opts[0], trace.WithAttributes(kv...))
	if len(d.Headers) > 0 {
		ctx = t.prop.Extract(ctx, propagation.MapCarrier(d.Headers))
		if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
			if !t.cfg.ProcessAsChild {
				opts = append(opts, trace.WithNewRoot())
			}
		}
	}
	ctx, _ = t.tracer.Start(ctx, ps.name, opts...)
	ps.consumed.n.Add(1)
	return ctx
}

// The default propagator's headers.
const (
	headerTraceparent = "traceparent"
	headerTracestate  = "tracestate"
	headerBaggage     = "baggage"
)

// traceparent reads the span context of h's traceparent and tracestate
// headers when the traceparent is of version 00 (what the W3C trace
// context propagator writes), as that propagator would, without the
// contexts its Extract makes. ok is false when h has no traceparent or
// one of another version: the caller asks the propagator then.
func traceparent(h map[string]string) (sc trace.SpanContext, ok bool) {
	v, found := h[headerTraceparent]
	if !found || len(v) < 2 || v[:2] != "00" {
		return sc, false
	}
	// 00-<32 hex trace id>-<16 hex span id>-<2 hex flags>, nothing more.
	if len(v) != 55 || v[2] != '-' || v[35] != '-' || v[52] != '-' {
		return sc, true // invalid: no context, as the propagator
	}
	var cfg trace.SpanContextConfig
	var err error
	if cfg.TraceID, err = trace.TraceIDFromHex(v[3:35]); err != nil {
		return sc, true
	}
	if cfg.SpanID, err = trace.SpanIDFromHex(v[36:52]); err != nil {
		return sc, true
	}
	flags, okf := hexByte(v[53], v[54])
	if !okf || flags > 3 {
		return sc, true // version 00 reserves the other bits
	}
	cfg.TraceFlags = trace.TraceFlags(flags) & (trace.FlagsSampled | trace.FlagsRandom)
	if ts, found := h[headerTracestate]; found {
		cfg.TraceState, _ = trace.ParseTraceState(ts)
	}
	cfg.Remote = true
	return trace.NewSpanContext(cfg), true
}

// hexByte decodes two lowercase hex digits.
func hexByte(hi, lo byte) (byte, bool) {
	h, ok1 := hexDigit(hi)
	l, ok2 := hexDigit(lo)
	return h<<4 | l, ok1 && ok2
}

func hexDigit(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
}

// attrBuf holds the attributes of a process span on their way to
// SetAttributes.
type attrBuf [7]attribute.KeyValue

// attrBufs are the attrBufs of spans that copy their attributes.
var attrBufs = sync.Pool{New: func() any { return new(attrBuf) }}

// setProcessAttrs sets the attributes of a delivery's recording process
// span: the topic's four, unless the span started with them
// (Config.SamplingAttributes), then the message id, the attempt and, for
// a subscriber's copy, the subscriber (KeyConsumerGroup), in one call.
// The slice given to SetAttributes is a pooled buffer when the span is
// known to copy it (the SDK's spans do), so that a sampled delivery does
// not allocate it; for another span type it is the span's to keep.
func (t *Telemetry) setProcessAttrs(span trace.Span, ps *processStart, d *outbox.Delivery) {
	n := 2
	if d.Subscriber != "" {
		n++
	}
	if !t.cfg.SamplingAttributes {
		n += len(ps.attrs)
	}
	copies := t.copiesAttributes(span)
	var buf *attrBuf
	var kv []attribute.KeyValue
	if copies {
		buf = attrBufs.Get().(*attrBuf)
		kv = buf[:0]
	} else {
		kv = make([]attribute.KeyValue, 0, n)
	}
	if !t.cfg.SamplingAttributes {
		kv = append(kv, ps.attrs[:]...)
	}
	kv = append(kv, KeyMessageID.String(d.ID.String()), KeyAttempt.Int(d.Attempt))
	if d.Subscriber != "" {
		kv = append(kv, KeyConsumerGroup.String(d.Subscriber))
	}
	span.SetAttributes(kv...)
	if copies {
		*buf = attrBuf{} // keep no id alive in the pool
		attrBufs.Put(buf)
	}
}

// sdkTracePkg is the package of the OpenTelemetry SDK's spans.
const sdkTracePkg = "go.opentelemetry.io/otel/sdk/trace"

// copiesAttributes reports whether span's SetAttributes is known to copy
// the slice it is given rather than keep it: true for the OpenTelemetry
// SDK's recording span (its SetAttributes appends the values to a slice
// of its own; TestAttrBufReuse fails if a version of the SDK stops doing
// so or renames the type), false for every other span type. Decided once
// per type.
func (t *Telemetry) copiesAttributes(span trace.Span) bool {
	rt := reflect.TypeOf(span)
	return t.copiers.get(rt, func() bool {
		return rt.Kind() == reflect.Pointer && rt.Elem().PkgPath() == sdkTracePkg && rt.Elem().Name() == "recordingSpan"
	})
}

// processStart is what every process span of a topic starts with, and
// the attributes of its consumed count: made once per topic.
type processStart struct {
	name string
	// attrs are the topic's attributes of every process span.
	attrs [4]attribute.KeyValue
	// opts are the kind, and attrs with Config.SamplingAttributes.
	opts     []trace.SpanStartOption
	root     []trace.SpanStartOption // opts and a new root
	consumed *count
	// done is the attribute set of the process duration of a success.
	done *measureOpts
}

func (t *Telemetry) processStart(topic string) *processStart {
	return t.starts.get(topic, func() *processStart { return t.makeProcessStart(topic) })
}

// makeProcessStart makes the processStart of topic.
func (t *Telemetry) makeProcessStart(topic string) *processStart {
	ps := &processStart{
		name: operationProcess + " " + topic,
		attrs: [4]attribute.KeyValue{KeySystem.String(System), KeyDestination.String(topic),
			KeyOperationName.String(operationProcess), KeyOperationType.String(operationProcess)},
		consumed: t.consumed.count(attrKey{topic: topic, op: operationProcess}),
		done:     t.opts(processKey(topic, outbox.OutcomeDone.String(), "")),
	}
	ps.opts = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer)}
	if t.cfg.SamplingAttributes {
		ps.opts = append(ps.opts, trace.WithAttributes(ps.attrs[:]...))
	}
	ps.root = append(ps.opts[:len(ps.opts):len(ps.opts)], trace.WithNewRoot())
	return ps
}

// processKey is the attribute set of a process duration.
func processKey(topic, outcome, errType string) attrKey {
	return attrKey{topic: topic, op: operationProcess, errType: errType, extraKey: KeyOutcome, extra: outcome}
}

// HandlerEnd ends the process span, with the outcome and error.type when
// the delivery did not succeed (a span without them succeeded), and
// records the handler's duration and retries. It implements
// [outbox.RelayObserver].
func (t *Telemetry) HandlerEnd(ctx context.Context, e outbox.HandlerEvent) {
	span := trace.SpanFromContext(ctx)
	if e.Outcome == outbox.OutcomeDone && e.Err == nil {
		// The common case, with its attribute set made once per topic.
		span.End()
		t.processDur.Record(ctx, e.Duration.Seconds(), t.processStart(e.Delivery.Topic).done.record...)
		return
	}
	outcome := e.Outcome.String()
	errType := errorType(e.Err)
	if e.Outcome != outbox.OutcomeDone {
		// Only here: adding an attribute to a started span copies its
		// attributes, a cost every success would pay for "done".
		span.SetAttributes(KeyOutcome.String(outcome))
	}
	if e.Err != nil {
		fail(span, e.Err, errType)
	}
	span.End()
	t.processDur.Record(ctx, e.Duration.Seconds(), t.opts(processKey(e.Delivery.Topic, outcome, errType)).record...)
	if e.Outcome == outbox.OutcomeRetry {
		t.retried.Add(ctx, 1, t.opts(attrKey{topic: e.Delivery.Topic, op: operationProcess, group: e.Delivery.Subscriber}).add...)
	}
}

// ClaimEnd records the claim's duration (and its span with
// Config.ClaimSpans). It implements [outbox.RelayObserver].
func (t *Telemetry) ClaimEnd(ctx context.Context, e outbox.ClaimEvent) {
	errType := errorType(e.Err)
	t.opDur.Record(ctx, e.Duration.Seconds(), t.opts(attrKey{op: operationClaim, errType: errType}).record...)
	if !t.cfg.ClaimSpans {
		return
	}
	_, span := t.tracer.Start(ctx, operationClaim, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithTimestamp(time.Now().Add(-e.Duration)), trace.WithAttributes(
			KeySystem.String(System), KeyOperationName.String(operationClaim), KeyOperationType.String(operationReceive),
			KeyBatchCount.Int(e.Claimed)))
	if e.Err != nil {
		fail(span, e.Err, errType)
	}
	span.End()
}

// SettleEnd records the write's duration (for a settle statement of its
// own) and the fenced-off outcomes (and a span with Config.SettleSpans).
// It implements [outbox.RelayObserver].
func (t *Telemetry) SettleEnd(ctx context.Context, e outbox.SettleEvent) {
	errType := errorType(e.Err)
	if !e.Carried {
		t.opDur.Record(ctx, e.Duration.Seconds(), t.opts(attrKey{op: operationSettle, errType: errType}).record...)
	}
	if e.FencedOff > 0 {
		t.fenced.Add(ctx, int64(e.FencedOff), t.opts(attrKey{op: operationSettle}).add...)
	}
	if !t.cfg.SettleSpans {
		return
	}
	_, span := t.tracer.Start(ctx, operationSettle, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithTimestamp(time.Now().Add(-e.Duration)), trace.WithAttributes(
			KeySystem.String(System), KeyOperationName.String(operationSettle), KeyOperationType.String(operationTypeSettl),
			KeyBatchCount.Int(e.Count), KeyFencedOff.Int(e.FencedOff), KeyCarriedByClaim.Bool(e.Carried)))
	if e.Err != nil {
		fail(span, e.Err, errType)
	}
	span.End()
}

// DeadLettered counts a dead letter, with its reason. It implements
// [outbox.RelayObserver].
func (t *Telemetry) DeadLettered(ctx context.Context, e outbox.DeadLetterEvent) {
	t.dead.Add(ctx, 1, t.opts(attrKey{topic: e.Topic, op: operationProcess, extraKey: KeyDeadReason, extra: e.Reason.String(), group: e.Subscriber}).add...)
}

// LeaseLost counts a lost lease. It implements [outbox.RelayObserver].
func (t *Telemetry) LeaseLost(ctx context.Context, e outbox.LeaseLostEvent) {
	t.leases.Add(ctx, 1, t.opts(attrKey{topic: e.Topic, op: operationProcess}).add...)
}

// ListenerChanged counts the listener's lost connections. It implements
// [outbox.RelayObserver].
func (t *Telemetry) ListenerChanged(ctx context.Context, s outbox.ListenerState) {
	if s == outbox.ListenerDown {
		t.listenerDown.Add(ctx, 1, t.opts(attrKey{}).add...)
	}
}
