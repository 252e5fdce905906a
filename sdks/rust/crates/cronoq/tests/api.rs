//! The traits the published API promises on its types, checked at compile time, and their
//! printed forms.

use std::fmt::Debug;
use std::future::Future;

use cronoq::{
    BlockingHandle, Clock, Error, MemoryStore, Scheduler, SubmitError, Task, TaskContext,
    TaskFailure, TaskHandle, TaskId, TaskRef, When,
};

fn shared<T: Clone + Send + Sync + 'static>() {}
fn error<T: std::error::Error + Clone + Send + Sync + 'static>() {}

/// A payload that is neither `Clone` nor `Debug`.
struct Opaque;

#[test]
fn types_have_the_promised_traits() {
    shared::<Scheduler<Opaque, Opaque>>();
    shared::<TaskContext>();
    shared::<Task<Opaque>>();
    shared::<TaskRef>();
    fn handle<T: Future + Send + Unpin + Debug>() {}
    handle::<TaskHandle<Opaque>>();
    fn blocking<T: Send + Debug>() {}
    blocking::<BlockingHandle<Opaque>>();
    error::<Error>();
    error::<SubmitError>();
    error::<TaskFailure>();
    error::<cronoq::TaskError>();
    fn copy<T: Copy + Debug>() {}
    copy::<Clock>();
    copy::<When>();
    copy::<MemoryStore>();
    copy::<cronoq::Priority>();
    copy::<cronoq::TaskStatus>();
    copy::<cronoq::MissPolicy>();
    copy::<cronoq::OverlapPolicy>();
    copy::<cronoq::EdgeCond>();
    copy::<cronoq::UnknownDependency>();
    copy::<cronoq::PriorityConfig>();
    copy::<cronoq::core::FixedStart>();
    shared::<cronoq::Recurring<Opaque>>();
    shared::<cronoq::RecurringSpec<Opaque>>();
    shared::<cronoq::ResourceConfig>();
    shared::<cronoq::Dep>();
    shared::<cronoq::GroupSnapshot>();
    error::<cronoq::ScaleError>();
    fn scaler<T: cronoq::Scaler + Copy + Default>() {}
    scaler::<cronoq::SlotScaler>();
    scaler::<cronoq::ExternalScaler>();
}

#[test]
fn the_core_module_names_the_roots_types() {
    let id: cronoq::TaskId = cronoq::core::TaskId(3);
    let bounds: cronoq::core::Bounds = cronoq::Bounds::default();
    let dep: cronoq::core::Dep = cronoq::Dep::on_success(id);
    assert_eq!(
        (bounds.max_pending, dep.cond),
        (None, cronoq::EdgeCond::OnSuccess)
    );
    let totals: cronoq::core::Totals = Default::default();
    assert_eq!(totals.submitted, 0);
}

#[test]
fn debug_forms_show_what_identifies_them() {
    let ctx = TaskContext::for_test(TaskId(4));
    assert_eq!(
        format!("{ctx:?}"),
        r#"TaskContext { id: TaskId(4), attempt: 1, pool: "default", kind: "default", key: None, .. }"#
    );
    assert!(format!("{:?}", Task::new(7u8)).starts_with("Task { spec: TaskSpec { payload: 7"));
    assert_eq!(Error::Shutdown.to_string(), "scheduler is shut down");
    assert_eq!(
        Error::from(SubmitError::Invalid("x")).to_string(),
        "invalid task: x"
    );
    assert_eq!(TaskRef::from(TaskId(12)).to_string(), "12");
}

#[tokio::test(start_paused = true)]
async fn a_handle_prints_its_id_and_whether_it_is_a_duplicate() {
    let s = Scheduler::<u8, u8>::builder()
        .pool(
            cronoq::Pool::fixed("default", 1)
                .executor_fn(|_ctx, n: std::sync::Arc<u8>| async move { Ok(*n) }),
        )
        .build()
        .await
        .unwrap();
    let h = s.submit(Task::new(1).key("k")).await.unwrap();
    let d = s.submit(Task::new(2).key("k")).await.unwrap();
    assert_eq!(
        format!("{h:?}"),
        "TaskHandle { id: TaskId(1), duplicate: false }"
    );
    assert_eq!(
        format!("{d:?}"),
        "TaskHandle { id: TaskId(1), duplicate: true }"
    );
}
