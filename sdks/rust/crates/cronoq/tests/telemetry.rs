//! Telemetry (feature `otel`) through a real OpenTelemetry SDK pipeline: in-memory span and
//! metric exporters, `tracing-subscriber` with the `tracing-opentelemetry` layer and the W3C
//! TraceContext propagator. The global meter provider and propagator are process-wide, so the
//! tests take turns (`SERIAL`); the tracing subscriber is set per test thread.

#![cfg(feature = "otel")]

use std::sync::Arc;
use std::time::Duration;

use cronoq::{
    AutoscaleConfig, Pool, Priority, RetryPolicy, Scheduler, Task, TaskContext, TaskError,
    TaskStatus,
};
use opentelemetry::trace::{SpanId, TraceContextExt, TraceId, TracerProvider as _};
use opentelemetry::{KeyValue, global};
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, Metric, MetricData, ResourceMetrics};
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use tracing::Instrument;
use tracing::subscriber::DefaultGuard;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// What an attempt saw of its trace context: `ctx.traceparent()` and how many tags the task
/// has (a captured context adds one).
type Seen = (Option<String>, usize);

fn seen(ctx: &TaskContext) -> Seen {
    (ctx.traceparent().map(str::to_owned), ctx.tags.len())
}

async fn tracing_scheduler() -> Scheduler<u32, Seen> {
    Scheduler::builder()
        .pool(
            Pool::fixed("default", 2).executor_fn(|ctx: TaskContext, _n: Arc<u32>| {
                let out = seen(&ctx);
                async move { Ok::<_, TaskError>(out) }
            }),
        )
        .build()
        .await
        .unwrap()
}

/// A tracing pipeline on this thread: the span exporter, and the guard that keeps the
/// subscriber installed.
fn traces() -> (InMemorySpanExporter, SdkTracerProvider, DefaultGuard) {
    global::set_text_map_propagator(TraceContextPropagator::new());
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("test"));
    let guard = tracing::subscriber::set_default(tracing_subscriber::registry().with(layer));
    (exporter, provider, guard)
}

/// The trace and span ids of a span.
fn ids(span: &tracing::Span) -> (TraceId, SpanId) {
    let cx = span.context();
    let sc = cx.span().span_context().clone();
    (sc.trace_id(), sc.span_id())
}

/// `00-<trace>-<span>-<flags>` split into its trace and span ids.
fn parse(traceparent: &str) -> (TraceId, SpanId) {
    let parts: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(parts.len(), 4, "{traceparent}");
    (
        TraceId::from_hex(parts[1]).unwrap(),
        SpanId::from_hex(parts[2]).unwrap(),
    )
}

fn attempt_spans(exporter: &InMemorySpanExporter) -> Vec<SpanData> {
    let spans = exporter.get_finished_spans().unwrap();
    spans
        .into_iter()
        .filter(|s| s.name == "cronoq.task")
        .collect()
}

/// An attribute's value as text (the layer records unsigned integers as text).
fn attr(span: &SpanData, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.as_str().into_owned())
}

#[tokio::test(start_paused = true)]
async fn a_task_submitted_in_a_span_carries_its_context_and_parents_its_attempt() {
    let _serial = SERIAL.lock().await;
    let (exporter, _provider, _guard) = traces();
    let s = tracing_scheduler().await;
    let request = tracing::info_span!("request");
    let (trace, parent) = ids(&request);
    assert_ne!(trace, TraceId::INVALID);
    let handle = s
        .submit(Task::new(7).kind("mail"))
        .instrument(request.clone())
        .await
        .unwrap();
    let id = handle.id();
    let (traceparent, count) = (*handle.await.unwrap()).clone();
    assert_eq!(count, 1);
    assert_eq!(parse(&traceparent.unwrap()), (trace, parent));
    s.shutdown(Duration::from_secs(5)).await.unwrap();

    let spans = attempt_spans(&exporter);
    assert_eq!(spans.len(), 1);
    let span = &spans[0];
    assert_eq!(span.span_context.trace_id(), trace);
    assert_eq!(span.parent_span_id, parent);
    let text = |s: &str| Some(s.to_owned());
    assert_eq!(attr(span, "task.id"), Some(id.0.to_string()));
    assert_eq!(attr(span, "task.pool"), text("default"));
    assert_eq!(attr(span, "task.kind"), text("mail"));
    assert_eq!(attr(span, "task.attempt"), text("1"));
}

#[tokio::test(start_paused = true)]
async fn every_way_of_submitting_captures_the_span() {
    let _serial = SERIAL.lock().await;
    let (_exporter, _provider, _guard) = traces();
    let s = tracing_scheduler().await;
    let request = tracing::info_span!("request");
    let expected = ids(&request);
    let (one, many, batch) = async {
        let one = s.enqueue(Task::new(1)).await.unwrap().id;
        let many = s.enqueue_many(vec![Task::new(2)]).await.unwrap();
        let batch = s.submit_batch(vec![Task::new(3)]).await.unwrap();
        (one, many[0].as_ref().unwrap().id, batch[0].id())
    }
    .instrument(request.clone())
    .await;
    for id in [one, many, batch] {
        let handle = s.handle(id).await.unwrap().unwrap();
        let (traceparent, count) = (*handle.await.unwrap()).clone();
        assert_eq!(count, 1, "task {id}");
        assert_eq!(parse(&traceparent.unwrap()), expected, "task {id}");
    }
    s.shutdown(Duration::from_secs(5)).await.unwrap();
}

const OWN: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

#[tokio::test(start_paused = true)]
async fn a_task_with_its_own_traceparent_keeps_it_and_parents_to_it() {
    let _serial = SERIAL.lock().await;
    let (exporter, _provider, _guard) = traces();
    let s = tracing_scheduler().await;
    let handle = s
        .submit(Task::new(1).tag("traceparent", OWN))
        .instrument(tracing::info_span!("request"))
        .await
        .unwrap();
    assert_eq!(*handle.await.unwrap(), (Some(OWN.to_owned()), 1));
    s.shutdown(Duration::from_secs(5)).await.unwrap();

    let spans = attempt_spans(&exporter);
    assert_eq!(spans.len(), 1);
    assert_eq!(
        (spans[0].span_context.trace_id(), spans[0].parent_span_id),
        parse(OWN)
    );
}

#[tokio::test(start_paused = true)]
async fn without_a_subscriber_no_tag_is_added() {
    let _serial = SERIAL.lock().await;
    global::set_text_map_propagator(TraceContextPropagator::new());
    let s = tracing_scheduler().await;
    let handle = s
        .submit(Task::new(1))
        .instrument(tracing::info_span!("request"))
        .await
        .unwrap();
    assert_eq!(*handle.await.unwrap(), (None, 0));
    s.shutdown(Duration::from_secs(5)).await.unwrap();
}

/// Blocking calls read the caller's span, on the caller's thread (outside a runtime) and from
/// the helper thread they wait on (inside one).
#[test]
fn blocking_calls_capture_the_callers_span() {
    let _serial = SERIAL.blocking_lock();
    let (_exporter, _provider, _guard) = traces();
    let check = |s: &cronoq::BlockingScheduler<u32, Seen>| {
        let request = tracing::info_span!("request");
        let expected = ids(&request);
        let _entered = request.enter();
        let (traceparent, count) = (*s.submit(Task::new(1)).unwrap().wait().unwrap()).clone();
        assert_eq!((parse(&traceparent.unwrap()), count), (expected, 1));
    };
    let s = Scheduler::builder()
        .pool(
            Pool::fixed("default", 1).executor_fn(|ctx: TaskContext, _n: Arc<u32>| {
                let out = seen(&ctx);
                async move { Ok::<_, TaskError>(out) }
            }),
        )
        .build_blocking()
        .unwrap();
    check(&s);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(async { check(&s) });
    s.shutdown(Duration::from_secs(5)).unwrap();
}

// --- metrics ---------------------------------------------------------------------------------

/// A meter provider exporting to memory, installed as the global one.
fn metrics() -> (InMemoryMetricExporter, SdkMeterProvider) {
    let exporter = InMemoryMetricExporter::default();
    let provider = SdkMeterProvider::builder()
        .with_reader(PeriodicReader::builder(exporter.clone()).build())
        .build();
    global::set_meter_provider(provider.clone());
    (exporter, provider)
}

fn attrs(pairs: &[(&'static str, &'static str)]) -> Vec<KeyValue> {
    let mut kvs: Vec<KeyValue> = pairs.iter().map(|(k, v)| KeyValue::new(*k, *v)).collect();
    kvs.sort_by(|a, b| a.key.cmp(&b.key));
    kvs
}

fn sorted<'a>(kvs: impl Iterator<Item = &'a KeyValue>) -> Vec<KeyValue> {
    let mut kvs: Vec<KeyValue> = kvs.cloned().collect();
    kvs.sort_by(|a, b| a.key.cmp(&b.key));
    kvs
}

/// The metrics of the meter `cronoq` in the latest export.
struct Exported(ResourceMetrics);

impl Exported {
    fn metric(&self, name: &str) -> &Metric {
        self.0
            .scope_metrics()
            .filter(|s| s.scope().name() == "cronoq")
            .flat_map(|s| s.metrics())
            .find(|m| m.name() == name)
            .unwrap_or_else(|| panic!("no metric {name}"))
    }

    /// A counter's value with exactly these attributes (None: no such point).
    fn sum(&self, name: &str, pairs: &[(&'static str, &'static str)]) -> Option<u64> {
        let AggregatedMetrics::U64(MetricData::Sum(sum)) = self.metric(name).data() else {
            panic!("{name} is not a u64 sum");
        };
        let want = attrs(pairs);
        sum.data_points()
            .find(|p| sorted(p.attributes()) == want)
            .map(|p| p.value())
    }

    /// A u64 gauge's value with exactly these attributes.
    fn gauge(&self, name: &str, pairs: &[(&'static str, &'static str)]) -> Option<u64> {
        let AggregatedMetrics::U64(MetricData::Gauge(g)) = self.metric(name).data() else {
            panic!("{name} is not a u64 gauge");
        };
        let want = attrs(pairs);
        g.data_points()
            .find(|p| sorted(p.attributes()) == want)
            .map(|p| p.value())
    }

    /// How many points a u64 gauge has (none when it is not exported).
    fn points(&self, name: &str) -> usize {
        let metric = self
            .0
            .scope_metrics()
            .flat_map(|s| s.metrics())
            .find(|m| m.name() == name);
        match metric.map(Metric::data) {
            None => 0,
            Some(AggregatedMetrics::U64(MetricData::Gauge(g))) => g.data_points().count(),
            Some(_) => panic!("{name} is not a u64 gauge"),
        }
    }

    /// A histogram's count and sum with exactly these attributes.
    fn histogram(&self, name: &str, pairs: &[(&'static str, &'static str)]) -> Option<(u64, f64)> {
        let AggregatedMetrics::F64(MetricData::Histogram(h)) = self.metric(name).data() else {
            panic!("{name} is not an f64 histogram");
        };
        let want = attrs(pairs);
        h.data_points()
            .find(|p| sorted(p.attributes()) == want)
            .map(|p| (p.count(), p.sum()))
    }
}

fn export(exporter: &InMemoryMetricExporter, provider: &SdkMeterProvider) -> Exported {
    exporter.reset();
    provider.force_flush().unwrap();
    let mut all = exporter.get_finished_metrics().unwrap();
    Exported(all.pop().expect("one export"))
}

/// Payloads of pool `a`: how its attempts end after 2 s.
const OK: u32 = 0;
const PERMANENT: u32 = 1;
const RETRY_ONCE: u32 = 2;
const PANIC: u32 = 3;

#[tokio::test(start_paused = true)]
async fn counters_histogram_and_gauges_after_a_known_workload() {
    let _serial = SERIAL.lock().await;
    let (exporter, provider) = metrics();
    // Autoscaled between 2 and 2 workers, for a price of 0.5 per worker-second.
    let a = Pool::new("a")
        .workers(2, 2, 2)
        .autoscale(AutoscaleConfig {
            cost_per_worker_second: 0.5,
            ..AutoscaleConfig::default()
        })
        .executor_fn(|ctx: TaskContext, n: Arc<u32>| async move {
            tokio::time::sleep(Duration::from_secs(2)).await;
            match *n {
                OK => Ok(0),
                PERMANENT => Err(TaskError::permanent("no")),
                RETRY_ONCE if ctx.attempt == 1 => {
                    Err(TaskError::retry_after("later", Duration::ZERO))
                }
                RETRY_ONCE => Ok(0),
                _ => panic!("boom"),
            }
        })
        .configure(|c| {
            c.retry = RetryPolicy {
                max_attempts: 3,
                jitter: false,
                ..RetryPolicy::default()
            }
        });
    let b = Pool::fixed("b", 1).executor_fn(|_ctx: TaskContext, _n: Arc<u32>| async move {
        std::future::pending::<Result<u32, TaskError>>().await
    });
    let s = Scheduler::builder().pool(a).pool(b).build().await.unwrap();

    let workload = [
        Task::new(OK),
        Task::new(OK).kind("report"),
        Task::new(PERMANENT),
        Task::new(RETRY_ONCE),
        Task::new(PANIC),
    ];
    let mut handles = Vec::new();
    for task in workload {
        handles.push(s.submit(task.pool("a")).await.unwrap());
    }
    let mut statuses = Vec::new();
    for h in handles {
        statuses.push(
            h.await
                .map(|_| TaskStatus::Succeeded)
                .unwrap_or_else(|f| f.status().unwrap()),
        );
    }
    use TaskStatus::{Failed, Succeeded};
    assert_eq!(statuses, [Succeeded, Succeeded, Failed, Succeeded, Failed]);

    // Pool b: one attempt that never ends, then a high and a low task waiting.
    let running = s.enqueue(Task::new(0).pool("b")).await.unwrap().id;
    while s.status(running).await.unwrap() != Some(TaskStatus::Running) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for p in [Priority::High, Priority::Low] {
        s.enqueue(Task::new(0).pool("b").priority(p)).await.unwrap();
    }
    // The gauges are refreshed about once a second.
    tokio::time::sleep(Duration::from_millis(1500)).await;

    let m = export(&exporter, &provider);
    let submitted = "cronoq.tasks.submitted";
    assert_eq!(m.sum(submitted, &[("pool", "a")]), Some(5));
    assert_eq!(m.sum(submitted, &[("pool", "b")]), Some(3));
    let finished = "cronoq.tasks.finished";
    assert_eq!(
        m.sum(finished, &[("pool", "a"), ("status", "succeeded")]),
        Some(3)
    );
    assert_eq!(
        m.sum(finished, &[("pool", "a"), ("status", "failed")]),
        Some(2)
    );
    assert_eq!(
        m.sum(finished, &[("pool", "b"), ("status", "succeeded")]),
        None
    );
    let attempts = "cronoq.attempts";
    let default_ok = [("pool", "a"), ("kind", "default"), ("outcome", "ok")];
    let default_error = [("pool", "a"), ("kind", "default"), ("outcome", "error")];
    let report_ok = [("pool", "a"), ("kind", "report"), ("outcome", "ok")];
    assert_eq!(m.sum(attempts, &default_ok), Some(2));
    assert_eq!(m.sum(attempts, &default_error), Some(3)); // permanent, retried, panicked
    assert_eq!(m.sum(attempts, &report_ok), Some(1));
    let duration = "cronoq.attempt.duration";
    assert_eq!(m.metric(duration).unit(), "s");
    assert_eq!(m.histogram(duration, &default_ok), Some((2, 4.0)));
    assert_eq!(m.histogram(duration, &default_error), Some((3, 6.0)));
    assert_eq!(m.histogram(duration, &report_ok), Some((1, 2.0)));

    for (pool, workers, busy) in [("a", 2, 0), ("b", 1, 1)] {
        let at = [("pool", pool)];
        assert_eq!(m.gauge("cronoq.pool.workers", &at), Some(workers), "{pool}");
        assert_eq!(
            m.gauge("cronoq.pool.desired_workers", &at),
            Some(workers),
            "{pool}"
        );
        assert_eq!(
            m.gauge("cronoq.pool.busy_workers", &at),
            Some(busy),
            "{pool}"
        );
        assert_eq!(m.gauge("cronoq.pool.held_workers", &at), Some(0), "{pool}");
    }
    let pending = "cronoq.pool.pending";
    for (class, n) in [("critical", 0), ("high", 1), ("normal", 0), ("low", 1)] {
        assert_eq!(
            m.gauge(pending, &[("pool", "b"), ("class", class)]),
            Some(n),
            "{class}"
        );
    }
    assert_eq!(
        m.gauge(pending, &[("pool", "a"), ("class", "normal")]),
        Some(0)
    );
    let AggregatedMetrics::F64(MetricData::Gauge(cost)) = m.metric("cronoq.pool.cost").data()
    else {
        panic!("cronoq.pool.cost is not an f64 gauge");
    };
    let cost = |pool: &'static str| {
        let want = attrs(&[("pool", pool)]);
        let point = cost.data_points().find(|p| sorted(p.attributes()) == want);
        point.map(|p| p.value())
    };
    // Pool a's cost at the latest refresh: 2 workers at 0.5 a second, for at least the
    // workload's 6 s, at most up to now.
    let now = s.snapshot().await.unwrap().pool("a").unwrap().cost;
    let a_cost = cost("a").unwrap();
    assert!((6.0..=now).contains(&a_cost), "{a_cost} (now {now})");
    assert_eq!(cost("b"), Some(0.0));

    // Cut off at shutdown: the attempt that never ended counts as an error.
    s.shutdown(Duration::ZERO).await.unwrap();
    let m = export(&exporter, &provider);
    let b_error = [("pool", "b"), ("kind", "default"), ("outcome", "error")];
    assert_eq!(m.sum(attempts, &b_error), Some(1));
    // A stopped scheduler's gauges report nothing.
    assert_eq!(m.points("cronoq.pool.workers"), 0);
}

/// The gauges follow a change a second later even when nothing else wakes the scheduler (a
/// fixed pool has no autoscaler timer).
#[tokio::test(start_paused = true)]
async fn gauges_are_refreshed_a_second_after_the_last_change() {
    let _serial = SERIAL.lock().await;
    let (exporter, provider) = metrics();
    let s = Scheduler::builder()
        .pool(
            Pool::fixed("idle", 1).executor_fn(|_ctx: TaskContext, _n: Arc<u32>| async move {
                std::future::pending::<Result<u32, TaskError>>().await
            }),
        )
        .build()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let busy = |m: &Exported| m.gauge("cronoq.pool.busy_workers", &[("pool", "idle")]);
    assert_eq!(busy(&export(&exporter, &provider)), Some(0));
    s.enqueue(Task::new(0).pool("idle")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(busy(&export(&exporter, &provider)), Some(1));
    s.shutdown(Duration::ZERO).await.unwrap();
}

// --- logs ------------------------------------------------------------------------------------

/// The events logged on this thread: level and message.
#[derive(Clone, Default)]
struct Logged(Arc<std::sync::Mutex<Vec<(tracing::Level, String)>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Logged {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Message(String);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.0 = format!("{value:?}");
                }
            }
        }
        let mut message = Message(String::new());
        event.record(&mut message);
        let level = *event.metadata().level();
        self.0.lock().unwrap().push((level, message.0));
    }
}

/// A runtime without timers makes the driver panic at its first wait: logged as an error, and
/// `shutdown` reports it.
#[test]
fn a_driver_that_panics_is_logged_as_an_error() {
    let logged = Logged::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(logged.clone()));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let result = runtime.block_on(async {
        let s = tracing_scheduler().await;
        s.shutdown(Duration::from_secs(1)).await
    });
    assert!(
        matches!(result, Err(cronoq::Error::Internal(_))),
        "{result:?}"
    );
    let logged = logged.0.lock().unwrap();
    let error = (
        tracing::Level::ERROR,
        "the scheduler's driver panicked: it stops".to_owned(),
    );
    assert!(logged.contains(&error), "{logged:?}");
}
