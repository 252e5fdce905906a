//! Without the feature `otel` (`cargo test --no-default-features`): a full OpenTelemetry
//! pipeline is installed, and the scheduler neither tags a task with the submitter's trace
//! context nor reports a metric.

#![cfg(not(feature = "otel"))]

use std::sync::Arc;
use std::time::Duration;

use cronoq::{Pool, Scheduler, Task, TaskContext, TaskError};
use opentelemetry::global;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::Instrument;
use tracing_subscriber::layer::SubscriberExt;

#[tokio::test(start_paused = true)]
async fn no_tag_and_no_metric() {
    global::set_text_map_propagator(TraceContextPropagator::new());
    let tracer = SdkTracerProvider::builder().build().tracer("test");
    let layer = tracing_opentelemetry::layer().with_tracer(tracer);
    let _guard = tracing::subscriber::set_default(tracing_subscriber::registry().with(layer));
    let exporter = InMemoryMetricExporter::default();
    let meters = SdkMeterProvider::builder()
        .with_reader(PeriodicReader::builder(exporter.clone()).build())
        .build();
    global::set_meter_provider(meters.clone());

    let s = Scheduler::builder()
        .pool(
            Pool::fixed("default", 1).executor_fn(|ctx: TaskContext, _n: Arc<u32>| {
                let tags = ctx.tags.len();
                async move { Ok::<_, TaskError>(tags) }
            }),
        )
        .build()
        .await
        .unwrap();
    let handle = s
        .submit(Task::new(1))
        .instrument(tracing::info_span!("request"))
        .await
        .unwrap();
    assert_eq!(*handle.await.unwrap(), 0);
    tokio::time::sleep(Duration::from_secs(2)).await;
    s.shutdown(Duration::from_secs(5)).await.unwrap();

    meters.force_flush().unwrap();
    let exported = exporter.get_finished_metrics().unwrap();
    let names: Vec<String> = exported
        .iter()
        .flat_map(|r| r.scope_metrics())
        .flat_map(|s| s.metrics())
        .map(|m| m.name().to_owned())
        .collect();
    assert!(names.is_empty(), "{names:?}");
}
