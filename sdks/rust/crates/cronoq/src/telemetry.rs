//! Telemetry (feature `otel`): OpenTelemetry metrics through the global meter provider (meter
//! `cronoq`), and trace context through the global text-map propagator, carried in a task's
//! `traceparent` tag.
//!
//! The driver and the submitting calls use the hooks below; without the feature they are
//! empty and compile to nothing. Attribute sets are built once per pool (and once per pool
//! and task kind for attempts), so a task costs a few instrument calls and no allocation.
//! The gauges report the engine's snapshot that the driver takes a second after a turn (so
//! about once a second while it works, and once after it falls idle: nothing they show
//! changes without a turn), never waking an idle scheduler again.

#[cfg(feature = "otel")]
pub(crate) use on::*;

#[cfg(not(feature = "otel"))]
pub(crate) use off::*;

#[cfg(feature = "otel")]
mod on {
    use std::future::Future;
    use std::sync::{Arc, Mutex, PoisonError};
    use std::time::Duration;

    use cronoq_core::model::{PoolSnapshot, Status};
    use opentelemetry::metrics::{Counter, Histogram, Meter, ObservableGauge};
    use opentelemetry::propagation::{Extractor, Injector};
    use opentelemetry::{KeyValue, global};
    use rustc_hash::FxHashMap;
    use tokio::time::Instant;
    use tracing::Instrument;
    use tracing::instrument::WithSubscriber;
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    use crate::executor::Tags;
    use crate::types::{Priority, TaskStatus};

    const TRACEPARENT: &str = "traceparent";

    /// How long after a turn the gauges are refreshed from a snapshot.
    const REFRESH: Duration = Duration::from_secs(1);

    /// Bucket bounds of `cronoq.attempt.duration`, in seconds (the SDK's default bounds are
    /// made for milliseconds).
    const DURATION_BOUNDS: [f64; 16] = [
        0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0,
        3600.0,
    ];

    fn meter() -> Meter {
        global::meter("cronoq")
    }

    fn pool_attr(name: &Arc<str>) -> KeyValue {
        KeyValue::new("pool", name.clone())
    }

    /// The driver's instruments, with their attribute sets.
    pub(crate) struct Telemetry {
        submitted: Counter<u64>,
        finished: Counter<u64>,
        attempts: Counter<u64>,
        duration: Histogram<f64>,
        /// `{pool}` per pool.
        pools: Vec<[KeyValue; 1]>,
        /// `{pool, status}` per pool and status (`pool * Status::ALL.len() + status`).
        statuses: Vec<[KeyValue; 2]>,
        /// Per pool, the kinds met so far: their index in `outcomes`.
        kinds: Vec<FxHashMap<Arc<str>, u32>>,
        /// Per pool, the latest kind and its index: tasks mostly share their kind's `Arc`
        /// (the default kind always), so comparing pointers spares hashing the name.
        last: Vec<Option<(Arc<str>, u32)>>,
        /// `{pool, kind, outcome}` per pool and kind: `ok`, then `error`.
        outcomes: Vec<[[KeyValue; 3]; 2]>,
        /// What the gauges report, and the gauges (kept for as long as the driver runs).
        gauges: Arc<Gauges>,
        _instruments: (Vec<ObservableGauge<u64>>, ObservableGauge<f64>),
        /// When the next refresh is due (engine seconds, and as an instant): a second after
        /// the first turn since the last one.
        due: Option<(f64, Instant)>,
    }

    /// What an attempt's metrics need at its end: its attribute sets and its start (engine
    /// seconds).
    pub(crate) struct AttemptMark {
        index: u32,
        started: f64,
    }

    impl Telemetry {
        /// The instruments of the global meter provider as it is now, for these pools.
        pub(crate) fn new<'a>(pools: impl Iterator<Item = &'a Arc<str>>) -> Self {
            let meter = meter();
            let names: Vec<Arc<str>> = pools.cloned().collect();
            let gauges = Arc::new(Gauges::new(&names));
            let instruments = gauges.register(&meter);
            let statuses = names
                .iter()
                .flat_map(|name| {
                    Status::ALL.iter().map(move |s| {
                        [
                            pool_attr(name),
                            KeyValue::new("status", TaskStatus::from_core(*s).name()),
                        ]
                    })
                })
                .collect();
            Telemetry {
                submitted: meter
                    .u64_counter("cronoq.tasks.submitted")
                    .with_description("Tasks admitted (a duplicate key's submission is not)")
                    .build(),
                finished: meter
                    .u64_counter("cronoq.tasks.finished")
                    .with_description("Tasks ended, by final status")
                    .build(),
                attempts: meter
                    .u64_counter("cronoq.attempts")
                    .with_description("Attempts ended, by outcome")
                    .build(),
                duration: meter
                    .f64_histogram("cronoq.attempt.duration")
                    .with_description("How long attempts ran")
                    .with_unit("s")
                    .with_boundaries(DURATION_BOUNDS.to_vec())
                    .build(),
                pools: names.iter().map(|name| [pool_attr(name)]).collect(),
                statuses,
                kinds: vec![FxHashMap::default(); names.len()],
                last: vec![None; names.len()],
                outcomes: Vec::new(),
                gauges,
                _instruments: instruments,
                // At once: the first turn refreshes them.
                due: Some((f64::NEG_INFINITY, Instant::now())),
            }
        }

        /// After a turn at `now`: refreshes the gauges from `snapshot` when due, else makes
        /// a refresh due a second from now if none is.
        #[inline]
        pub(crate) fn turned(&mut self, now: f64, snapshot: impl FnOnce() -> Vec<PoolSnapshot>) {
            match self.due {
                Some((due, _)) if now >= due => {
                    self.gauges.set(&snapshot());
                    self.due = None;
                }
                Some(_) => {}
                None => self.due = Some((now + REFRESH.as_secs_f64(), Instant::now() + REFRESH)),
            }
        }

        /// When the driver must wake to refresh the gauges.
        #[inline]
        pub(crate) fn refresh_at(&self) -> Option<Instant> {
            self.due.map(|(_, at)| at)
        }

        /// A task was admitted into this pool.
        #[inline]
        pub(crate) fn submitted(&self, pool: usize) {
            self.submitted.add(1, &self.pools[pool]);
        }

        /// A task of this pool ended.
        #[inline]
        pub(crate) fn finished(&self, pool: usize, status: Status) {
            let i = pool * Status::ALL.len() + status as usize;
            self.finished.add(1, &self.statuses[i]);
        }

        /// An attempt starts now.
        #[inline]
        pub(crate) fn start(&mut self, pool: usize, kind: &Arc<str>, now: f64) -> AttemptMark {
            let index = match &self.last[pool] {
                Some((last, index)) if Arc::ptr_eq(last, kind) => *index,
                _ => self.find_kind(pool, kind),
            };
            AttemptMark {
                index,
                started: now,
            }
        }

        /// The kind's index, added if new; it becomes the pool's latest.
        fn find_kind(&mut self, pool: usize, kind: &Arc<str>) -> u32 {
            let index = match self.kinds[pool].get(kind) {
                Some(&index) => index,
                None => self.add_kind(pool, kind),
            };
            self.last[pool] = Some((kind.clone(), index));
            index
        }

        #[cold]
        fn add_kind(&mut self, pool: usize, kind: &Arc<str>) -> u32 {
            let index = u32::try_from(self.outcomes.len()).expect("fewer than 2^32 kinds");
            let [pool_kv] = self.pools[pool].clone();
            let kind_kv = KeyValue::new("kind", kind.clone());
            self.outcomes.push(["ok", "error"].map(|outcome| {
                [
                    pool_kv.clone(),
                    kind_kv.clone(),
                    KeyValue::new("outcome", outcome),
                ]
            }));
            self.kinds[pool].insert(kind.clone(), index);
            index
        }

        /// The attempt ended now, successfully or not.
        #[inline]
        pub(crate) fn end(&self, mark: &AttemptMark, ok: bool, now: f64) {
            let attrs = &self.outcomes[mark.index as usize][usize::from(!ok)];
            self.attempts.add(1, attrs);
            self.duration.record((now - mark.started).max(0.0), attrs);
        }
    }

    impl Drop for Telemetry {
        /// The scheduler has stopped: its gauges report nothing from now on.
        fn drop(&mut self) {
            self.gauges.clear();
        }
    }

    /// One pool's gauge values, from the latest snapshot.
    struct PoolValues {
        workers: u64,
        desired: u64,
        busy: u64,
        held: u64,
        pending: [u64; 4],
        cost: f64,
    }

    /// The gauges' attribute sets, and their values: empty before the first snapshot and
    /// after the scheduler has stopped (its gauges then report nothing).
    struct Gauges {
        pools: Vec<[KeyValue; 1]>,
        classes: Vec<[[KeyValue; 2]; 4]>,
        values: Mutex<Vec<PoolValues>>,
    }

    impl Gauges {
        fn new(names: &[Arc<str>]) -> Self {
            Gauges {
                pools: names.iter().map(|name| [pool_attr(name)]).collect(),
                classes: names
                    .iter()
                    .map(|name| {
                        Priority::ALL.map(|p| [pool_attr(name), KeyValue::new("class", p.name())])
                    })
                    .collect(),
                values: Mutex::new(Vec::new()),
            }
        }

        fn set(&self, pools: &[PoolSnapshot]) {
            let count = |n: i64| u64::try_from(n).unwrap_or(0);
            let values = pools
                .iter()
                .map(|p| PoolValues {
                    workers: count(p.capacity),
                    desired: count(p.desired),
                    busy: count(p.busy),
                    held: count(p.held),
                    pending: p.pending_by_class.map(count),
                    cost: p.cost,
                })
                .collect();
            *self.values.lock().unwrap_or_else(PoisonError::into_inner) = values;
        }

        fn clear(&self) {
            self.values
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clear();
        }

        /// Calls `f` with each pool's values and index.
        fn each(&self, mut f: impl FnMut(usize, &PoolValues)) {
            let values = self.values.lock().unwrap_or_else(PoisonError::into_inner);
            for (i, v) in values.iter().enumerate() {
                f(i, v);
            }
        }

        /// The observable gauges, reading `self`.
        fn register(
            self: &Arc<Self>,
            meter: &Meter,
        ) -> (Vec<ObservableGauge<u64>>, ObservableGauge<f64>) {
            type Read = fn(&PoolValues) -> u64;
            let per_pool: [(&'static str, &'static str, Read); 4] = [
                ("cronoq.pool.workers", "Worker slots", |v| v.workers),
                ("cronoq.pool.desired_workers", "Target worker slots", |v| {
                    v.desired
                }),
                ("cronoq.pool.busy_workers", "Attempts running", |v| v.busy),
                (
                    "cronoq.pool.held_workers",
                    "Free slots held for fixed starts",
                    |v| v.held,
                ),
            ];
            let mut gauges: Vec<ObservableGauge<u64>> = per_pool
                .into_iter()
                .map(|(name, description, read)| {
                    let g = self.clone();
                    meter
                        .u64_observable_gauge(name)
                        .with_description(description)
                        .with_callback(move |o| g.each(|i, v| o.observe(read(v), &g.pools[i])))
                        .build()
                })
                .collect();
            let g = self.clone();
            gauges.push(
                meter
                    .u64_observable_gauge("cronoq.pool.pending")
                    .with_description("Tasks pending, by priority class")
                    .with_callback(move |o| {
                        g.each(|i, v| {
                            for (n, attrs) in v.pending.iter().zip(&g.classes[i]) {
                                o.observe(*n, attrs);
                            }
                        })
                    })
                    .build(),
            );
            let g = self.clone();
            let cost = meter
                .f64_observable_gauge("cronoq.pool.cost")
                .with_description("Worker-seconds times the autoscaler's cost per worker-second")
                .with_callback(move |o| g.each(|i, v| o.observe(v.cost, &g.pools[i])))
                .build();
            (gauges, cost)
        }
    }

    /// Appends the current span's trace context to a task's tags as a `traceparent` tag (the
    /// published crate's one tag; other fields the propagator injects are left out), unless
    /// they have one already. Outside an enabled span, or when the propagator injects no
    /// `traceparent`, the tags stay as they are.
    pub(crate) fn capture(tags: &mut Vec<(Arc<str>, Arc<str>)>) {
        if tags.iter().any(|(k, _)| &**k == TRACEPARENT) {
            return;
        }
        let span = tracing::Span::current();
        if span.is_disabled() {
            return;
        }
        let cx = span.context();
        global::get_text_map_propagator(|p| p.inject_context(&cx, &mut TagInjector(tags)));
    }

    /// Runs a blocking call's future in the caller's span and subscriber, whichever thread
    /// polls it, so that [`capture`] sees that span.
    pub(crate) fn in_caller_span<F: Future>(f: F) -> impl Future<Output = F::Output> {
        f.instrument(tracing::Span::current())
            .with_current_subscriber()
    }

    /// Makes the task's trace context, read from its tags, the OpenTelemetry parent of its
    /// attempt's span.
    pub(crate) fn parent(span: &tracing::Span, tags: &Tags) {
        if span.is_disabled() || !tags.iter().any(|(k, _)| &**k == TRACEPARENT) {
            return;
        }
        let cx = global::get_text_map_propagator(|p| p.extract(&TagExtractor(tags)));
        // Without the OpenTelemetry layer there is no OpenTelemetry span to give a parent.
        let _ = span.set_parent(cx);
    }

    struct TagInjector<'a>(&'a mut Vec<(Arc<str>, Arc<str>)>);

    impl Injector for TagInjector<'_> {
        fn set(&mut self, key: &str, value: String) {
            if key == TRACEPARENT && !value.is_empty() {
                self.0.push((key.into(), value.into()));
            }
        }
    }

    struct TagExtractor<'a>(&'a [(Arc<str>, Arc<str>)]);

    impl Extractor for TagExtractor<'_> {
        fn get(&self, key: &str) -> Option<&str> {
            self.0.iter().find(|(k, _)| &**k == key).map(|(_, v)| &**v)
        }

        fn keys(&self) -> Vec<&str> {
            self.0.iter().map(|(k, _)| &**k).collect()
        }
    }
}

/// Without the feature: the same hooks, doing nothing.
#[cfg(not(feature = "otel"))]
mod off {
    use std::future::Future;
    use std::sync::Arc;

    use cronoq_core::model::{PoolSnapshot, Status};
    use tokio::time::Instant;

    use crate::executor::Tags;

    pub(crate) struct Telemetry;

    pub(crate) struct AttemptMark;

    impl Telemetry {
        pub(crate) fn new<'a>(_pools: impl Iterator<Item = &'a Arc<str>>) -> Self {
            Telemetry
        }

        #[inline(always)]
        pub(crate) fn turned(&mut self, _now: f64, _snapshot: impl FnOnce() -> Vec<PoolSnapshot>) {}

        #[inline(always)]
        pub(crate) fn refresh_at(&self) -> Option<Instant> {
            None
        }

        #[inline(always)]
        pub(crate) fn submitted(&self, _pool: usize) {}

        #[inline(always)]
        pub(crate) fn finished(&self, _pool: usize, _status: Status) {}

        #[inline(always)]
        pub(crate) fn start(&mut self, _pool: usize, _kind: &Arc<str>, _now: f64) -> AttemptMark {
            AttemptMark
        }

        #[inline(always)]
        pub(crate) fn end(&self, _mark: &AttemptMark, _ok: bool, _now: f64) {}
    }

    #[inline(always)]
    pub(crate) fn capture(_tags: &mut Vec<(Arc<str>, Arc<str>)>) {}

    #[inline(always)]
    pub(crate) fn in_caller_span<F: Future>(f: F) -> F {
        f
    }

    #[inline(always)]
    pub(crate) fn parent(_span: &tracing::Span, _tags: &Tags) {}
}
