//! The column encodings of a persistent store (feature `store-codec`): plain functions that
//! turn what a [`Mutation`](crate::Mutation) carries into column values and back, so that
//! stores share one encoding. It is the Python `SqliteStore`'s (the file a Python and a Rust
//! process share): times in Unix nanoseconds, durations in float seconds, options as the
//! Python store's JSON. `cronoq-store-sqlite` writes and reads its file with these.
//!
//! ```
//! use std::sync::Arc;
//! use cronoq::codec;
//! use cronoq::{Dep, TaskId};
//!
//! let tags: Vec<codec::Tag> = vec![(Arc::from("team"), Arc::from("data"))];
//! assert_eq!(codec::tags_json(&tags), r#"{"team":"data"}"#);
//! assert_eq!(codec::tags_from(r#"{"team":"data"}"#).unwrap(), tags);
//!
//! let deps = [Dep::on_success(TaskId(7)), Dep::on_failure("load")];
//! let text = codec::deps_json(&deps);
//! assert_eq!(text, r#"[[7,"success"],["load","failure"]]"#);
//! assert_eq!(codec::deps_from(&text).unwrap(), deps);
//! ```

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::Value;
use serde_json::value::RawValue;

use crate::config::RetryPolicy;
use crate::deps::{Dep, EdgeCond};
use crate::fixed::{FixedStart, MissPolicy};
use crate::recurring::{OverlapPolicy, RecurringSpec};
use crate::store::TimeBase;
use crate::task::TaskSpec;
use crate::time::Time;
use crate::types::{Priority, TaskId, TaskRef};

/// A tag or label: name and value.
pub type Tag = (Arc<str>, Arc<str>);

/// The text with each NUL replaced by U+FFFD (for databases whose text cannot hold NUL);
/// borrowed when it has none.
pub fn clean(text: &str) -> Cow<'_, str> {
    if text.contains('\0') {
        Cow::Owned(text.replace('\0', "\u{FFFD}"))
    } else {
        Cow::Borrowed(text)
    }
}

/// [`clean`], owned.
pub fn cleaned(text: &str) -> String {
    clean(text).into_owned()
}

/// Engine time as Unix nanoseconds (saturating).
pub fn to_unix(base: TimeBase, t: Time) -> i64 {
    base.unix_nanos_at_zero
        .saturating_add(i64::try_from(t.0).unwrap_or(i64::MAX))
}

/// Unix nanoseconds as engine time (times before engine time zero read as zero).
pub fn from_unix(base: TimeBase, ns: i64) -> Time {
    Time(u64::try_from(ns.saturating_sub(base.unix_nanos_at_zero)).unwrap_or(0))
}

/// A duration as nanoseconds (saturating).
pub fn dur_ns(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

/// Nanoseconds as a duration (negative reads as zero).
pub fn ns_dur(ns: i64) -> Duration {
    Duration::from_nanos(u64::try_from(ns).unwrap_or(0))
}

/// Float seconds (how the Python store keeps durations) as a duration: negative or NaN reads
/// as zero, too large (or infinite) as `Duration::MAX`.
pub fn secs(value: f64) -> Duration {
    if value.is_nan() || value <= 0.0 {
        Duration::ZERO
    } else {
        Duration::try_from_secs_f64(value).unwrap_or(Duration::MAX)
    }
}

/// A late fixed start's policy by its Python name: `run_late`, `skip` or `fail`.
pub fn miss_name(policy: MissPolicy) -> &'static str {
    match policy {
        MissPolicy::RunLate => "run_late",
        MissPolicy::Skip => "skip",
        MissPolicy::Fail => "fail",
    }
}

/// [`miss_name`]'s inverse; an unknown name reads as the default, `run_late`.
pub fn miss_from(name: &str) -> MissPolicy {
    match name {
        "skip" => MissPolicy::Skip,
        "fail" => MissPolicy::Fail,
        _ => MissPolicy::RunLate,
    }
}

/// An overlap policy by its Python name: `skip`, `allow`, `queue` or `queue_on_success`.
pub fn overlap_name(policy: OverlapPolicy) -> &'static str {
    match policy {
        OverlapPolicy::Skip => "skip",
        OverlapPolicy::Allow => "allow",
        OverlapPolicy::Queue => "queue",
        OverlapPolicy::QueueOnSuccess => "queue_on_success",
    }
}

/// [`overlap_name`]'s inverse; an unknown name reads as the default, `skip`.
pub fn overlap_from(name: &str) -> OverlapPolicy {
    match name {
        "allow" => OverlapPolicy::Allow,
        "queue" => OverlapPolicy::Queue,
        "queue_on_success" => OverlapPolicy::QueueOnSuccess,
        _ => OverlapPolicy::Skip,
    }
}

/// Dependencies as the Python store writes them: `[[parent id or key, "success" | "complete" |
/// "failure"], …]`.
pub fn deps_json(deps: &[Dep]) -> String {
    let edges: Vec<Value> = deps
        .iter()
        .map(|d| {
            let target = match &d.target {
                TaskRef::Id(id) => Value::from(id.0),
                TaskRef::Key(key) => Value::from(&**key),
            };
            let on = match d.cond {
                EdgeCond::OnSuccess => "success",
                EdgeCond::OnComplete => "complete",
                EdgeCond::OnFailure => "failure",
            };
            serde_json::json!([target, on])
        })
        .collect();
    Value::from(edges).to_string()
}

/// [`deps_json`]'s inverse (conditions also as `on_success`, `on_complete`, `on_failure`).
pub fn deps_from(text: &str) -> Result<Vec<Dep>, String> {
    let bad = || format!("dependencies {text:?}: not [[id or key, condition], …]");
    let value: Value = serde_json::from_str(text).map_err(|_| bad())?;
    let edges = value.as_array().ok_or_else(bad)?;
    edges
        .iter()
        .map(|edge| {
            let [target, on] = edge.as_array().map(Vec::as_slice).ok_or_else(bad)? else {
                return Err(bad());
            };
            let target = match target {
                Value::Number(n) => TaskRef::Id(TaskId(n.as_u64().ok_or_else(bad)?)),
                Value::String(key) => TaskRef::Key(Arc::from(key.as_str())),
                _ => return Err(bad()),
            };
            let on = on.as_str().ok_or_else(bad)?;
            let cond = match on.strip_prefix("on_").unwrap_or(on) {
                "success" => EdgeCond::OnSuccess,
                "complete" => EdgeCond::OnComplete,
                "failure" => EdgeCond::OnFailure,
                _ => return Err(bad()),
            };
            Ok(Dep { target, cond })
        })
        .collect()
}

/// A retry policy as the Python store writes one: `[max_attempts, initial_backoff,
/// multiplier, max_backoff, jitter]`, durations in float seconds; a multiplier that is not
/// finite (JSON has no infinity) is written as the default, 2.0. `None` for none.
pub fn retry_json(policy: &Option<RetryPolicy>) -> Option<String> {
    let p = policy.as_ref()?;
    let multiplier = if p.multiplier.is_finite() {
        p.multiplier
    } else {
        2.0
    };
    let json = serde_json::json!([
        p.max_attempts,
        p.initial_backoff.as_secs_f64(),
        multiplier,
        p.max_backoff.as_secs_f64(),
        p.jitter,
    ]);
    Some(json.to_string())
}

/// [`retry_json`]'s inverse. Python writes an infinite duration as `Infinity` (a float its
/// `json.dumps` allows), read here as `Duration::MAX`; `max_attempts` reads as at least 1.
pub fn retry_from(text: Option<&str>) -> Result<Option<RetryPolicy>, String> {
    let Some(text) = text else { return Ok(None) };
    let finite = text
        .replace("-Infinity", "0")
        .replace("Infinity", "1.7976931348623157e308");
    let (attempts, initial, multiplier, max, jitter): (u64, f64, f64, f64, bool) =
        serde_json::from_str(&finite).map_err(|e| format!("retry policy {text:?}: {e}"))?;
    Ok(Some(RetryPolicy {
        max_attempts: u32::try_from(attempts.max(1)).unwrap_or(u32::MAX),
        initial_backoff: secs(initial),
        multiplier: if multiplier.is_finite() {
            multiplier
        } else {
            2.0
        },
        max_backoff: secs(max),
        jitter,
    }))
}

/// Resources as the Python store writes them: `{name: amount, …}`.
pub fn resources_json(resources: &[(Arc<str>, u32)]) -> String {
    let mut out = serde_json::Map::new();
    for (name, amount) in resources {
        out.insert(name.to_string(), Value::from(*amount));
    }
    Value::Object(out).to_string()
}

/// [`resources_json`]'s inverse.
pub fn resources_from(text: &str) -> Result<Vec<(Arc<str>, u32)>, String> {
    let bad = || format!("resources {text:?}: not {{name: amount, …}}");
    let value: Value = serde_json::from_str(text).map_err(|_| bad())?;
    value
        .as_object()
        .ok_or_else(bad)?
        .iter()
        .map(|(name, amount)| {
            let amount = amount.as_u64().and_then(|a| u32::try_from(a).ok());
            Ok((Arc::from(name.as_str()), amount.ok_or_else(bad)?))
        })
        .collect()
}

/// Tags as the Python store writes them: a JSON object, in order. The Python library keeps
/// tags in a dict, so a name given twice reads back there as its last value; here
/// ([`tags_from`]) every pair comes back.
pub fn tags_json(tags: &[Tag]) -> String {
    let mut out = String::from("{");
    for (i, (k, v)) in tags.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&Value::from(&**k).to_string());
        out.push(':');
        out.push_str(&Value::from(&**v).to_string());
    }
    out.push('}');
    out
}

/// Labels, written as tags are ([`tags_json`]).
pub fn labels_json(labels: &[Tag]) -> String {
    tags_json(labels)
}

/// [`tags_json`]'s inverse (for labels too): the pairs in the order written, repeated names
/// included.
pub fn tags_from(text: &str) -> Result<Vec<Tag>, String> {
    let mut de = serde_json::Deserializer::from_str(text);
    de.deserialize_map(Pairs)
        .and_then(|p| de.end().map(|()| p))
        .map_err(|e| format!("tags {text:?}: {e}"))
}

/// A JSON object's members in order, each value a string.
struct Pairs;

impl<'de> Visitor<'de> for Pairs {
    type Value = Vec<Tag>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object of strings")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::new();
        while let Some((k, v)) = map.next_entry::<String, String>()? {
            out.push((Arc::from(k), Arc::from(v)));
        }
        Ok(out)
    }
}

/// A schedule's definition as the Python store writes it (`cronoq_recurring.spec`): a JSON
/// object with its members in the Python order, durations in float seconds, the retry policy
/// as the text [`retry_json`] makes, resources, tags and labels as objects (`null` when none).
/// The template's payload goes in a column of its own. The definition holds no times, so
/// `base` changes nothing.
pub fn recurring_json(base: TimeBase, spec: &RecurringSpec<Bytes>) -> String {
    let _ = base;
    let t = &spec.template;
    let text = |v: Option<&str>| v.map_or(Value::Null, Value::from);
    let float = |d: Option<Duration>| d.map_or(Value::Null, |d| Value::from(d.as_secs_f64()));
    let or_null = |empty: bool, json: &dyn Fn() -> String| {
        if empty { "null".to_string() } else { json() }
    };
    let members: [(&str, String); 17] = [
        ("cron", Value::from(&*spec.cron).to_string()),
        ("tz", text(spec.tz.as_deref()).to_string()),
        ("pool", Value::from(&*t.pool).to_string()),
        ("priority", t.priority.index().to_string()),
        ("kind", Value::from(&*t.kind).to_string()),
        ("key", text(t.key.as_deref()).to_string()),
        ("tenant", text(t.tenant.as_deref()).to_string()),
        ("deadline_in", float(spec.deadline_after).to_string()),
        ("duration_hint", float(t.duration_hint).to_string()),
        ("timeout", float(t.timeout).to_string()),
        ("retry", text(retry_json(&t.retry).as_deref()).to_string()),
        (
            "resources",
            or_null(t.resources.is_empty(), &|| resources_json(&t.resources)),
        ),
        ("tags", or_null(t.tags.is_empty(), &|| tags_json(&t.tags))),
        (
            "labels",
            or_null(t.labels.is_empty(), &|| labels_json(&t.labels)),
        ),
        (
            "overlap",
            Value::from(overlap_name(spec.overlap)).to_string(),
        ),
        (
            "tolerance",
            Value::from(spec.tolerance.as_secs_f64()).to_string(),
        ),
        ("on_miss", Value::from(miss_name(spec.on_miss)).to_string()),
    ];
    let mut out = String::from("{");
    for (i, (name, value)) in members.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push('"');
        out.push_str(name);
        out.push_str("\":");
        out.push_str(value);
    }
    out.push('}');
    out
}

/// A stored schedule back ([`recurring_json`]'s inverse), named `name`, with its template's
/// payload. Members a Python process may leave out read as its defaults.
pub fn recurring_from(
    base: TimeBase,
    name: String,
    spec: &str,
    payload: Vec<u8>,
) -> Result<RecurringSpec<Bytes>, String> {
    let _ = base;
    let bad = |what: &str| format!("recurring schedule {name:?}: {what} in {spec:?}");
    // Each member as written: tags and labels keep their order.
    let members: std::collections::HashMap<String, &RawValue> =
        serde_json::from_str(spec).map_err(|e| bad(&e.to_string()))?;
    let raw = |m: &str| members.get(m).map(|v| v.get()).filter(|v| *v != "null");
    let member = |m: &str| -> Option<Value> { raw(m).and_then(|v| serde_json::from_str(v).ok()) };
    let string = |m: &str| -> Result<Option<Arc<str>>, String> {
        member(m)
            .map(|v| v.as_str().map(Arc::from).ok_or_else(|| bad(m)))
            .transpose()
    };
    let float = |m: &str| -> Result<Option<Duration>, String> {
        member(m)
            .map(|v| v.as_f64().map(secs).ok_or_else(|| bad(m)))
            .transpose()
    };
    let mut template = TaskSpec::new(Bytes::from(payload));
    template.pool = string("pool")?.ok_or_else(|| bad("no pool"))?;
    template.kind = string("kind")?.unwrap_or_else(|| Arc::from("default"));
    template.priority = match member("priority") {
        None => Priority::Normal,
        Some(p) => p
            .as_u64()
            .and_then(|p| usize::try_from(p).ok())
            .and_then(Priority::from_index)
            .ok_or_else(|| bad("priority"))?,
    };
    template.key = string("key")?;
    template.tenant = string("tenant")?;
    template.duration_hint = float("duration_hint")?;
    template.timeout = float("timeout")?;
    template.retry = retry_from(string("retry")?.as_deref())?;
    if let Some(r) = raw("resources") {
        template.resources = resources_from(r)?.into_iter().collect();
    }
    if let Some(t) = raw("tags") {
        template.tags = tags_from(t)?;
    }
    if let Some(l) = raw("labels") {
        template.labels = tags_from(l)?;
    }
    Ok(RecurringSpec {
        cron: string("cron")?.ok_or_else(|| bad("no cron"))?,
        tz: string("tz")?,
        template,
        deadline_after: float("deadline_in")?,
        overlap: string("overlap")?
            .as_deref()
            .map_or(OverlapPolicy::Skip, overlap_from),
        tolerance: float("tolerance")?.unwrap_or(Duration::from_secs(1)),
        on_miss: string("on_miss")?
            .as_deref()
            .map_or(MissPolicy::RunLate, miss_from),
        name: Arc::from(name),
    })
}

/// A fixed start's columns: its time in Unix nanoseconds, its tolerance in nanoseconds (the
/// Python store keeps float seconds: `ns_dur(t).as_secs_f64()`) and its `on_miss` name; all
/// `None` without one.
pub fn fixed_cols(
    base: TimeBase,
    start: &Option<FixedStart>,
) -> (Option<i64>, Option<i64>, Option<String>) {
    match start {
        None => (None, None, None),
        Some(f) => (
            Some(to_unix(base, f.at)),
            Some(dur_ns(f.tolerance)),
            Some(miss_name(f.on_miss).to_string()),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_replaces_nul() {
        assert!(matches!(clean("plain"), Cow::Borrowed("plain")));
        assert_eq!(cleaned("a\0b"), "a\u{FFFD}b");
    }

    #[test]
    fn times_and_durations() {
        let base = TimeBase {
            unix_nanos_at_zero: 1_000,
        };
        assert_eq!(from_unix(base, to_unix(base, Time(5))), Time(5));
        assert_eq!(from_unix(base, 10), Time(0));
        assert_eq!(to_unix(TimeBase::default(), Time::MAX), i64::MAX);
        assert_eq!(
            ns_dur(dur_ns(Duration::from_millis(1500))),
            Duration::from_millis(1500)
        );
        assert_eq!(dur_ns(Duration::MAX), i64::MAX);
        assert_eq!(ns_dur(-5), Duration::ZERO);
        assert_eq!(secs(f64::INFINITY), Duration::MAX);
        assert_eq!(secs(-1.0), Duration::ZERO);
    }

    #[test]
    fn policies_by_name_and_unknown_names_as_defaults() {
        for p in [MissPolicy::RunLate, MissPolicy::Skip, MissPolicy::Fail] {
            assert_eq!(miss_from(miss_name(p)), p);
        }
        assert_eq!(miss_from("later"), MissPolicy::RunLate);
        for p in [
            OverlapPolicy::Skip,
            OverlapPolicy::Allow,
            OverlapPolicy::Queue,
            OverlapPolicy::QueueOnSuccess,
        ] {
            assert_eq!(overlap_from(overlap_name(p)), p);
        }
        assert_eq!(overlap_from("sometimes"), OverlapPolicy::Skip);
    }

    #[test]
    fn deps_round_trip() {
        let deps = vec![
            Dep::on_success(TaskId(u64::MAX)),
            Dep::on_complete("k"),
            Dep::on_failure("f"),
        ];
        assert_eq!(deps_from(&deps_json(&deps)).unwrap(), deps);
        assert_eq!(
            deps_from(r#"[["k","on_complete"]]"#).unwrap(),
            [Dep::on_complete("k")]
        );
        assert!(deps_from(r#"[["k","sometimes"]]"#).is_err());
        assert!(deps_from("{}").is_err());
    }

    #[test]
    fn retry_round_trips_and_reads_python_infinity() {
        let policy = RetryPolicy {
            max_attempts: 4,
            initial_backoff: Duration::from_millis(250),
            multiplier: 1.5,
            max_backoff: Duration::from_secs(30),
            jitter: false,
        };
        let text = retry_json(&Some(policy)).unwrap();
        assert_eq!(text, "[4,0.25,1.5,30.0,false]");
        assert_eq!(retry_from(Some(&text)).unwrap(), Some(policy));
        assert_eq!(retry_json(&None), None);
        assert_eq!(retry_from(None).unwrap(), None);
        let wild = RetryPolicy {
            multiplier: f64::NAN,
            ..policy
        };
        assert_eq!(retry_json(&Some(wild)).unwrap(), "[4,0.25,2.0,30.0,false]");
        let inf = retry_from(Some("[0,1.0,2.0,Infinity,true]"))
            .unwrap()
            .unwrap();
        assert_eq!((inf.max_attempts, inf.max_backoff), (1, Duration::MAX));
        assert!(retry_from(Some("[1]")).is_err());
    }

    #[test]
    fn resources_and_tags_round_trip() {
        let resources: Vec<(Arc<str>, u32)> = vec![("db".into(), 2), ("gpu".into(), 1)];
        assert_eq!(
            resources_from(&resources_json(&resources)).unwrap(),
            resources
        );
        assert!(resources_from(r#"{"db":-1}"#).is_err());
        let tags: Vec<Tag> = vec![
            ("b".into(), "1".into()),
            ("a\"".into(), "é".into()),
            ("b".into(), "2".into()),
        ];
        let text = tags_json(&tags);
        assert_eq!(text, r#"{"b":"1","a\"":"é","b":"2"}"#);
        assert_eq!(tags_from(&text).unwrap(), tags);
        assert_eq!(labels_json(&tags), text);
        assert!(tags_from("[1]").is_err());
    }

    #[test]
    fn schedules_round_trip_in_the_python_order() {
        let base = TimeBase::default();
        let template = TaskSpec::new(Bytes::from_static(b"p"))
            .pool("io")
            .kind("report")
            .priority(Priority::High)
            .key("nightly")
            .tenant("acme")
            .duration_hint(Duration::from_millis(1500))
            .timeout(Duration::from_secs(2))
            .retry(RetryPolicy::default())
            .resource("db", 1)
            .tag("b", "1")
            .tag("a", "2")
            .label("zone", "eu");
        let spec = RecurringSpec {
            name: "n".into(),
            cron: "0 2 * * *".into(),
            tz: Some("Europe/Berlin".into()),
            template,
            deadline_after: Some(Duration::from_secs(60)),
            overlap: OverlapPolicy::Queue,
            tolerance: Duration::from_millis(2500),
            on_miss: MissPolicy::Skip,
        };
        let text = recurring_json(base, &spec);
        assert!(
            text.starts_with(
                r#"{"cron":"0 2 * * *","tz":"Europe/Berlin","pool":"io","priority":1,"#
            ),
            "{text}"
        );
        assert!(text.ends_with(r#""tags":{"b":"1","a":"2"},"labels":{"zone":"eu"},"overlap":"queue","tolerance":2.5,"on_miss":"skip"}"#), "{text}");
        let back = recurring_from(base, "n".into(), &text, b"p".to_vec()).unwrap();
        assert_eq!(recurring_json(base, &back), text);
        assert_eq!((&*back.name, &back.template.payload[..]), ("n", &b"p"[..]));
        let plain = RecurringSpec {
            template: TaskSpec::new(Bytes::new()),
            tz: None,
            deadline_after: None,
            ..spec
        };
        let text = recurring_json(base, &plain);
        assert!(
            text.contains(r#""retry":null,"resources":null,"tags":null,"labels":null"#),
            "{text}"
        );
        let back = recurring_from(base, "n".into(), &text, Vec::new()).unwrap();
        assert_eq!(recurring_json(base, &back), text);
        let minimal = recurring_from(
            base,
            "m".into(),
            r#"{"cron":"* * * * *","pool":"p"}"#,
            Vec::new(),
        )
        .unwrap();
        assert_eq!(
            (minimal.overlap, minimal.on_miss, minimal.tolerance),
            (
                OverlapPolicy::Skip,
                MissPolicy::RunLate,
                Duration::from_secs(1)
            )
        );
        assert!(
            recurring_from(base, "x".into(), "{}", Vec::new())
                .unwrap_err()
                .contains("no pool")
        );
    }

    #[test]
    fn fixed_start_columns() {
        let base = TimeBase::default();
        assert_eq!(fixed_cols(base, &None), (None, None, None));
        let start = FixedStart {
            at: Time(5_000),
            tolerance: Duration::from_millis(1500),
            on_miss: MissPolicy::Fail,
        };
        assert_eq!(
            fixed_cols(base, &Some(start)),
            (Some(5_000), Some(1_500_000_000), Some("fail".to_string()))
        );
    }
}
