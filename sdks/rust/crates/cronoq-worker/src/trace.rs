use std::collections::HashMap;

use crate::proto;

/// The task tag that carries a task's W3C `traceparent`.
pub const TRACEPARENT: &str = "traceparent";
/// The task tag that carries a task's W3C `tracestate`.
pub const TRACESTATE: &str = "tracestate";

/// A task's W3C trace context (<https://www.w3.org/TR/trace-context/>): its tags
/// `traceparent` and `tracestate`, which the server keeps with the task and hands to every
/// attempt. The crate records no spans itself: a program that traces with OpenTelemetry gets
/// these strings from its propagator for a submit, and gives them to it as the parent of an
/// attempt's span.
///
/// ```
/// use cronoq_worker::TraceContext;
/// use cronoq_worker::proto::TaskSpec;
///
/// let trace = TraceContext::new("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
///     .with_tracestate("vendor=abc");
/// let spec = TaskSpec { pool: "default".into(), ..Default::default() }.with_trace_context(&trace);
/// assert_eq!(spec.tags["traceparent"], trace.traceparent);
/// assert_eq!(spec.tags["tracestate"], "vendor=abc");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TraceContext {
    /// The W3C `traceparent`, such as `00-<trace id>-<parent span id>-01`.
    pub traceparent: String,
    /// The W3C `tracestate`; None or empty sends none.
    pub tracestate: Option<String>,
}

impl TraceContext {
    /// A trace context without a tracestate.
    pub fn new(traceparent: impl Into<String>) -> Self {
        Self {
            traceparent: traceparent.into(),
            tracestate: None,
        }
    }

    /// Sets the tracestate.
    pub fn with_tracestate(mut self, tracestate: impl Into<String>) -> Self {
        self.tracestate = Some(tracestate.into());
        self
    }

    /// The trace context in a task's tags, None without a `traceparent` tag.
    pub fn from_tags(tags: &HashMap<String, String>) -> Option<Self> {
        let traceparent = tags.get(TRACEPARENT).filter(|v| !v.is_empty())?;
        Some(Self {
            traceparent: traceparent.clone(),
            tracestate: tags.get(TRACESTATE).filter(|v| !v.is_empty()).cloned(),
        })
    }

    /// Puts the trace context into `tags` as `traceparent` and `tracestate`, unless they have a
    /// `traceparent` of their own, which wins. An empty traceparent adds nothing.
    pub fn apply_to(&self, tags: &mut HashMap<String, String>) {
        if self.traceparent.is_empty() || tags.contains_key(TRACEPARENT) {
            return;
        }
        tags.insert(TRACEPARENT.to_owned(), self.traceparent.clone());
        match self.tracestate.as_deref() {
            Some(state) if !state.is_empty() => {
                tags.insert(TRACESTATE.to_owned(), state.to_owned());
            }
            _ => {
                tags.remove(TRACESTATE);
            }
        }
    }
}

impl proto::TaskSpec {
    /// The submit option for a task's trace context, for `Submit` and each spec of
    /// `SubmitBatch`: sets the tags `traceparent` and `tracestate` from `trace` unless the spec's
    /// tags already name a `traceparent`, which wins (see [`TraceContext::apply_to`]).
    pub fn with_trace_context(mut self, trace: &TraceContext) -> Self {
        trace.apply_to(&mut self.tags);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    fn tags(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn sets_both_tags_and_keeps_the_others() {
        let spec = proto::TaskSpec {
            tags: tags(&[("a", "b")]),
            ..Default::default()
        }
        .with_trace_context(&TraceContext::new(PARENT).with_tracestate("vendor=abc"));
        assert_eq!(
            spec.tags,
            tags(&[
                ("a", "b"),
                (TRACEPARENT, PARENT),
                (TRACESTATE, "vendor=abc")
            ])
        );
    }

    #[test]
    fn the_callers_own_traceparent_tag_wins() {
        let own = tags(&[(TRACEPARENT, "00-1-2-01"), (TRACESTATE, "mine=1")]);
        let spec = proto::TaskSpec {
            tags: own.clone(),
            ..Default::default()
        }
        .with_trace_context(&TraceContext::new(PARENT).with_tracestate("vendor=abc"));
        assert_eq!(spec.tags, own);
    }

    #[test]
    fn no_tracestate_and_empty_contexts() {
        let mut t = tags(&[(TRACESTATE, "stale=1")]);
        TraceContext::new(PARENT).apply_to(&mut t);
        assert_eq!(t, tags(&[(TRACEPARENT, PARENT)]));
        let mut t = HashMap::new();
        TraceContext::default().apply_to(&mut t);
        assert!(t.is_empty());
    }

    #[test]
    fn read_back_from_tags() {
        assert_eq!(TraceContext::from_tags(&HashMap::new()), None);
        assert_eq!(
            TraceContext::from_tags(&tags(&[(TRACEPARENT, PARENT), (TRACESTATE, "")])),
            Some(TraceContext::new(PARENT))
        );
        assert_eq!(
            TraceContext::from_tags(&tags(&[(TRACEPARENT, PARENT), (TRACESTATE, "v=1")])),
            Some(TraceContext::new(PARENT).with_tracestate("v=1"))
        );
    }
}
