//! Values to columns and back, in the Python store's encodings (`src/cronoq/store/rows.py`):
//! times are Unix nanoseconds, durations float seconds, ids signed 64-bit integers (two's
//! complement of the unsigned id), options JSON.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use cronoq::{
    Dep, EdgeCond, MissPolicy, OverlapPolicy, Priority, RecurringSpec, RetryPolicy, TaskId,
    TaskRef, TaskSpec, Time, TimeBase,
};
use serde::de::{Deserializer, MapAccess, Visitor};

/// Tags as a task spec holds them: pairs in order.
pub(crate) type Tags = Vec<(Arc<str>, Arc<str>)>;

/// A task id as its column keeps it (ids from 2^63 on, of shards 128-255, are negative).
pub(crate) fn signed(id: u64) -> i64 {
    id as i64
}

/// The id a column value stands for (`signed`'s inverse).
pub(crate) fn unsigned(value: i64) -> u64 {
    value as u64
}

/// Engine time as Unix nanoseconds.
pub(crate) fn to_unix(base: TimeBase, t: Time) -> i64 {
    base.unix_nanos_at_zero
        .saturating_add(i64::try_from(t.0).unwrap_or(i64::MAX))
}

/// Unix nanoseconds as engine time (times before engine time zero read as zero).
pub(crate) fn from_unix(base: TimeBase, ns: i64) -> Time {
    Time(u64::try_from(ns.saturating_sub(base.unix_nanos_at_zero)).unwrap_or(0))
}

/// Unix nanoseconds as wall-clock time.
pub(crate) fn system_time(ns: i64) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns.unsigned_abs())
    } else {
        UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs())
    }
}

/// The wall clock in Unix nanoseconds.
pub(crate) fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// A duration as nanoseconds (saturating).
pub(crate) fn nanos(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

/// Float seconds (how the Python store keeps durations) as a duration: negative or NaN reads
/// as zero, too large (or infinite) as `Duration::MAX`.
pub(crate) fn secs(value: f64) -> Duration {
    if value.is_nan() || value <= 0.0 {
        Duration::ZERO
    } else {
        Duration::try_from_secs_f64(value).unwrap_or(Duration::MAX)
    }
}

/// A retry policy as the Python store writes one: `[max_attempts, initial_backoff,
/// multiplier, max_backoff, jitter]`, durations in float seconds.
pub(crate) fn retry_json(policy: &RetryPolicy) -> String {
    serde_json::json!([
        policy.max_attempts,
        policy.initial_backoff.as_secs_f64(),
        finite(policy.multiplier),
        policy.max_backoff.as_secs_f64(),
        policy.jitter,
    ])
    .to_string()
}

/// JSON has no infinity or NaN: those are written as the Python default's multiplier (2.0).
fn finite(v: f64) -> f64 {
    if v.is_finite() { v } else { 2.0 }
}

/// [`retry_json`]'s inverse. Python writes an infinite duration as `Infinity` (a float
/// `json.dumps` allows), read here as `Duration::MAX`; `max_attempts` reads as at least 1.
pub(crate) fn retry_from(text: &str) -> Result<RetryPolicy, String> {
    let finite = text
        .replace("-Infinity", "0")
        .replace("Infinity", "1.7976931348623157e308");
    let (attempts, initial, multiplier, max, jitter): (u64, f64, f64, f64, bool) =
        serde_json::from_str(&finite).map_err(|e| format!("retry policy {text:?}: {e}"))?;
    Ok(RetryPolicy {
        max_attempts: u32::try_from(attempts.max(1)).unwrap_or(u32::MAX),
        initial_backoff: secs(initial),
        multiplier: if multiplier.is_finite() {
            multiplier
        } else {
            2.0
        },
        max_backoff: secs(max),
        jitter,
    })
}

/// Tags as the Python store writes them: a JSON object, in order. The Python library keeps
/// tags in a dict, so a key given twice reads back there as its last value; here every pair
/// comes back.
pub(crate) fn tags_json(tags: &[(Arc<str>, Arc<str>)]) -> String {
    let mut out = String::from("{");
    for (i, (k, v)) in tags.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&serde_json::Value::from(&**k).to_string());
        out.push(':');
        out.push_str(&serde_json::Value::from(&**v).to_string());
    }
    out.push('}');
    out
}

/// [`tags_json`]'s inverse: the pairs in the order written, repeated keys included.
pub(crate) fn tags_from(text: &str) -> Result<Tags, String> {
    let mut de = serde_json::Deserializer::from_str(text);
    let pairs = de
        .deserialize_map(Pairs)
        .and_then(|p| de.end().map(|()| p))
        .map_err(|e| format!("tags {text:?}: {e}"))?;
    Ok(pairs)
}

/// A JSON object's members in order, each value a string.
struct Pairs;

impl<'de> Visitor<'de> for Pairs {
    type Value = Tags;

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

/// Dependencies as the Python store writes them: `[[parent id or key, "success" | "complete" |
/// "failure"], …]`.
pub(crate) fn deps_json(deps: &[Dep]) -> String {
    let edges: Vec<serde_json::Value> = deps
        .iter()
        .map(|d| {
            let target = match &d.target {
                TaskRef::Id(id) => serde_json::Value::from(id.0),
                TaskRef::Key(key) => serde_json::Value::from(&**key),
            };
            let on = match d.cond {
                EdgeCond::OnSuccess => "success",
                EdgeCond::OnComplete => "complete",
                EdgeCond::OnFailure => "failure",
            };
            serde_json::json!([target, on])
        })
        .collect();
    serde_json::Value::from(edges).to_string()
}

/// [`deps_json`]'s inverse (conditions also as `on_success`, `on_complete`, `on_failure`).
pub(crate) fn deps_from(text: &str) -> Result<Vec<Dep>, String> {
    let bad = || format!("dependencies {text:?}: not [[id or key, condition], …]");
    let value: serde_json::Value = serde_json::from_str(text).map_err(|_| bad())?;
    let edges = value.as_array().ok_or_else(bad)?;
    edges
        .iter()
        .map(|edge| {
            let [target, on] = edge.as_array().map(Vec::as_slice).ok_or_else(bad)? else {
                return Err(bad());
            };
            let target = match target {
                serde_json::Value::Number(n) => TaskRef::Id(TaskId(n.as_u64().ok_or_else(bad)?)),
                serde_json::Value::String(key) => TaskRef::Key(Arc::from(key.as_str())),
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

/// Resources as the Python store writes them: `{name: amount, …}`, in order.
pub(crate) fn resources_json(resources: &[(Arc<str>, u32)]) -> String {
    let mut out = serde_json::Map::new();
    for (name, amount) in resources {
        out.insert(name.to_string(), serde_json::Value::from(*amount));
    }
    serde_json::Value::Object(out).to_string()
}

/// [`resources_json`]'s inverse.
pub(crate) fn resources_from(text: &str) -> Result<Vec<(Arc<str>, u32)>, String> {
    let bad = || format!("resources {text:?}: not {{name: amount, …}}");
    let value: serde_json::Value = serde_json::from_str(text).map_err(|_| bad())?;
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

/// A fixed start's policy for a late start, by the Python name.
pub(crate) fn miss_name(policy: MissPolicy) -> &'static str {
    match policy {
        MissPolicy::RunLate => "run_late",
        MissPolicy::Skip => "skip",
        MissPolicy::Fail => "fail",
    }
}

/// [`miss_name`]'s inverse.
pub(crate) fn miss_from(name: &str) -> Result<MissPolicy, String> {
    match name {
        "run_late" => Ok(MissPolicy::RunLate),
        "skip" => Ok(MissPolicy::Skip),
        "fail" => Ok(MissPolicy::Fail),
        _ => Err(format!("unknown on_miss {name:?}")),
    }
}

/// An overlap policy by the Python name.
pub(crate) fn overlap_name(policy: OverlapPolicy) -> &'static str {
    match policy {
        OverlapPolicy::Skip => "skip",
        OverlapPolicy::Allow => "allow",
        OverlapPolicy::Queue => "queue",
        OverlapPolicy::QueueOnSuccess => "queue_on_success",
    }
}

/// [`overlap_name`]'s inverse.
fn overlap_from(name: &str) -> Result<OverlapPolicy, String> {
    match name {
        "skip" => Ok(OverlapPolicy::Skip),
        "allow" => Ok(OverlapPolicy::Allow),
        "queue" => Ok(OverlapPolicy::Queue),
        "queue_on_success" => Ok(OverlapPolicy::QueueOnSuccess),
        _ => Err(format!("unknown overlap {name:?}")),
    }
}

/// A schedule's definition as the Python store writes it in `cronoq_recurring.spec`: a JSON
/// object with its members in the Python order, durations in float seconds, the retry policy
/// as the text [`retry_json`] makes, resources, tags and labels as objects (`null` when
/// none). The template's payload goes in its own column.
pub(crate) fn recurring_json(spec: &RecurringSpec<Bytes>) -> String {
    use serde_json::Value;
    let t = &spec.template;
    let text = |v: Option<&str>| v.map_or(Value::Null, Value::from);
    let float = |d: Option<Duration>| d.map_or(Value::Null, |d| Value::from(d.as_secs_f64()));
    let object = |pairs: &[(Arc<str>, Arc<str>)]| {
        if pairs.is_empty() {
            "null".to_string()
        } else {
            tags_json(pairs)
        }
    };
    let resources = if t.resources.is_empty() {
        "null".to_string()
    } else {
        resources_json(&t.resources)
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
        (
            "retry",
            t.retry
                .as_ref()
                .map_or(Value::Null, |r| Value::from(retry_json(r)))
                .to_string(),
        ),
        ("resources", resources),
        ("tags", object(&t.tags)),
        ("labels", object(&t.labels)),
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

/// A stored schedule back ([`recurring_json`]'s inverse), with its template's payload (none
/// reads as empty bytes).
pub(crate) fn recurring_from(
    name: String,
    text: &str,
    payload: Option<Vec<u8>>,
) -> Result<RecurringSpec<Bytes>, String> {
    use serde_json::Value;
    use serde_json::value::RawValue;
    let bad = |what: &str| format!("recurring schedule {name:?}: {what} in {text:?}");
    // Each member as written: tags and labels keep their order.
    let members: std::collections::HashMap<String, &RawValue> =
        serde_json::from_str(text).map_err(|e| bad(&e.to_string()))?;
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
    let object = |m: &str| raw(m).map(str::to_string);
    let mut template = TaskSpec::new(Bytes::from(payload.unwrap_or_default()));
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
    template.retry = string("retry")?.as_deref().map(retry_from).transpose()?;
    if let Some(r) = object("resources") {
        template.resources = resources_from(&r)?.into_iter().collect();
    }
    if let Some(t) = object("tags") {
        template.tags = tags_from(&t)?;
    }
    if let Some(l) = object("labels") {
        template.labels = tags_from(&l)?;
    }
    Ok(RecurringSpec {
        cron: string("cron")?.ok_or_else(|| bad("no cron"))?,
        tz: string("tz")?,
        template,
        deadline_after: float("deadline_in")?,
        overlap: string("overlap")?
            .as_deref()
            .map_or(Ok(OverlapPolicy::Skip), overlap_from)?,
        tolerance: float("tolerance")?.unwrap_or(Duration::from_secs(1)),
        on_miss: string("on_miss")?
            .as_deref()
            .map_or(Ok(MissPolicy::RunLate), miss_from)?,
        name: Arc::from(name),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_round_trips_and_reads_python_infinity() {
        let policy = RetryPolicy {
            max_attempts: 4,
            initial_backoff: Duration::from_millis(250),
            multiplier: 1.5,
            max_backoff: Duration::from_secs(30),
            jitter: false,
        };
        let text = retry_json(&policy);
        assert_eq!(text, "[4,0.25,1.5,30.0,false]");
        assert_eq!(retry_from(&text).unwrap(), policy);
        let inf = retry_from("[0,1.0,2.0,Infinity,true]").unwrap();
        assert_eq!((inf.max_attempts, inf.max_backoff), (1, Duration::MAX));
    }

    #[test]
    fn tags_keep_order_and_repeats() {
        let tags: Vec<(Arc<str>, Arc<str>)> = vec![
            ("b".into(), "1".into()),
            ("a\"".into(), "é".into()),
            ("b".into(), "2".into()),
        ];
        let text = tags_json(&tags);
        assert_eq!(text, r#"{"b":"1","a\"":"é","b":"2"}"#);
        assert_eq!(tags_from(&text).unwrap(), tags);
        assert!(tags_from("[1]").is_err());
    }

    #[test]
    fn ids_and_times() {
        assert_eq!(signed(1 << 48 | 1), (1 << 48) + 1);
        assert_eq!(unsigned(signed(u64::MAX - 1)), u64::MAX - 1);
        let base = TimeBase {
            unix_nanos_at_zero: 1_000,
        };
        assert_eq!(from_unix(base, to_unix(base, Time(5))), Time(5));
        assert_eq!(from_unix(base, 10), Time(0));
        assert_eq!(secs(f64::INFINITY), Duration::MAX);
        assert_eq!(secs(-1.0), Duration::ZERO);
    }
}
