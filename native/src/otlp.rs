//! `otlp_encode`: span records (plain Python tuples, see src/cronoq/_otlp.py) into one OTLP
//! `ExportTraceServiceRequest` (opentelemetry/proto/collector/trace/v1), hand-encoded.
//!
//! The records are copied out under the GIL (downcasts and extractions only), then encoded
//! with the GIL released. The bytes are protobuf's canonical encoding (fields in number order,
//! proto3 defaults left out), the same as `cronoq._otlp.encode_python` gives: keep the two in
//! step, tests/unit/test_otlp.py compares them.

use std::fmt;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};

enum Value {
    Str(String),
    Bool(bool),
    Int(i64),
    Double(f64),
}

struct Span {
    trace_id: [u8; 16],
    span_id: [u8; 8],
    parent: Option<[u8; 8]>,
    name: String,
    kind: u64,
    start: u64,
    end: u64,
    attributes: Vec<(String, Value)>,
    status_code: u64,
    status_message: String,
    links: Vec<([u8; 16], [u8; 8])>,
}

/// Encodes span records into an OTLP/HTTP protobuf body (see the module docs).
#[pyfunction]
pub fn otlp_encode<'py>(
    py: Python<'py>,
    resource: &Bound<'py, PyDict>,
    scope: &Bound<'py, PyAny>,
    scope_version: &Bound<'py, PyAny>,
    spans: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyBytes>> {
    let mut attrs = Vec::with_capacity(resource.len());
    for (key, value) in resource.iter() {
        let key = text(&key, At::Name("resource attribute key"))?;
        if !value.is_instance_of::<PyString>() {
            return Err(PyTypeError::new_err(format!(
                "resource attribute values must be str, not {}",
                type_name(&value)
            )));
        }
        let value = text(&value, At::Name("resource attribute value"))?;
        attrs.push((key, Value::Str(value)));
    }
    let scope = text(scope, At::Name("scope"))?;
    let scope_version = text(scope_version, At::Name("scope_version"))?;
    let records = items(spans, At::Name("spans"))?;
    let mut decoded = Vec::with_capacity(records.len());
    for (index, record) in records.iter().enumerate() {
        decoded.push(span(index, record)?);
    }
    let body = py.detach(move || encode(&attrs, &scope, &scope_version, &decoded));
    Ok(PyBytes::new(py, &body))
}

// --- extraction, under the GIL ---------------------------------------------------------------

/// Where a value sits, for error messages: formatted only when there is an error.
#[derive(Clone, Copy)]
enum At<'a> {
    /// An argument, or a resource attribute's part.
    Name(&'a str),
    /// `span {index}`, then the field's name unless empty.
    Field(usize, &'static str),
    /// `span {index} {attribute|link} {item}`, then the part's name unless empty.
    Item(usize, &'static str, usize, &'static str),
}

impl fmt::Display for At<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let part = match *self {
            At::Name(name) => return f.write_str(name),
            At::Field(index, field) => {
                write!(f, "span {index}")?;
                field
            }
            At::Item(index, what, item, part) => {
                write!(f, "span {index} {what} {item}")?;
                part
            }
        };
        if part.is_empty() {
            Ok(())
        } else {
            write!(f, " {part}")
        }
    }
}

fn type_name(value: &Bound<'_, PyAny>) -> String {
    value
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

/// A tuple's or list's items, else TypeError.
fn items<'py>(value: &Bound<'py, PyAny>, at: At<'_>) -> PyResult<Vec<Bound<'py, PyAny>>> {
    if let Ok(tuple) = value.cast::<PyTuple>() {
        return Ok(tuple.iter().collect());
    }
    if let Ok(list) = value.cast::<PyList>() {
        return Ok(list.iter().collect());
    }
    Err(PyTypeError::new_err(format!(
        "{at} must be a tuple or list, not {}",
        type_name(value)
    )))
}

fn text(value: &Bound<'_, PyAny>, at: At<'_>) -> PyResult<String> {
    let s = value.cast::<PyString>().map_err(|_| {
        PyTypeError::new_err(format!("{at} must be a str, not {}", type_name(value)))
    })?;
    match s.to_str() {
        Ok(s) => Ok(s.to_owned()),
        Err(_) => Err(PyValueError::new_err(format!(
            "{at} is not valid Unicode (a lone surrogate)"
        ))),
    }
}

fn hex_id<const N: usize>(value: &Bound<'_, PyAny>, at: At<'_>) -> PyResult<[u8; N]> {
    let s = value.cast::<PyString>().map_err(|_| {
        PyTypeError::new_err(format!("{at} must be a str, not {}", type_name(value)))
    })?;
    let bad = || PyValueError::new_err(format!("{at} must be {} lowercase hex digits", N * 2));
    let s = s.to_str().map_err(|_| bad())?;
    let digits = s.as_bytes();
    if digits.len() != N * 2 {
        return Err(bad());
    }
    let mut out = [0u8; N];
    for (i, pair) in digits.chunks_exact(2).enumerate() {
        out[i] = (nibble(pair[0]).ok_or_else(bad)? << 4) | nibble(pair[1]).ok_or_else(bad)?;
    }
    Ok(out)
}

fn nibble(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

fn uint(value: &Bound<'_, PyAny>, high: u64, at: At<'_>) -> PyResult<u64> {
    if !value.is_instance_of::<PyInt>() {
        return Err(PyTypeError::new_err(format!(
            "{at} must be an int, not {}",
            type_name(value)
        )));
    }
    match value.extract::<u64>() {
        Ok(n) if n <= high => Ok(n),
        _ => Err(PyValueError::new_err(format!(
            "{at} must be in [0, {high}]"
        ))),
    }
}

fn pair<'py>(
    value: &Bound<'py, PyAny>,
    at: At<'_>,
) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
    let mut pair = items(value, at)?;
    if pair.len() != 2 {
        return Err(PyValueError::new_err(format!(
            "{at} must be a pair, not {} items",
            pair.len()
        )));
    }
    let second = pair.pop().expect("two items");
    let first = pair.pop().expect("two items");
    Ok((first, second))
}

fn attribute(value: &Bound<'_, PyAny>, index: usize, item: usize) -> PyResult<Value> {
    let at = At::Item(index, "attribute", item, "");
    if let Ok(b) = value.cast::<PyBool>() {
        return Ok(Value::Bool(b.is_true()));
    }
    if value.is_instance_of::<PyString>() {
        return Ok(Value::Str(text(
            value,
            At::Item(index, "attribute", item, "value"),
        )?));
    }
    if value.is_instance_of::<PyInt>() {
        return value
            .extract::<i64>()
            .map(Value::Int)
            .map_err(|_| PyValueError::new_err(format!("{at} value is out of the int64 range")));
    }
    if let Ok(f) = value.cast::<PyFloat>() {
        return Ok(Value::Double(f.value()));
    }
    Err(PyTypeError::new_err(format!(
        "{at} value must be str, int, float or bool, not {}",
        type_name(value)
    )))
}

fn span(index: usize, record: &Bound<'_, PyAny>) -> PyResult<Span> {
    let at = At::Field(index, "");
    let fields = items(record, at)?;
    let [
        trace_id,
        span_id,
        parent,
        name,
        kind,
        start,
        end,
        attributes,
        status_code,
        status_message,
        links,
    ] = <[Bound<'_, PyAny>; 11]>::try_from(fields).map_err(|fields| {
        PyValueError::new_err(format!("{at} must have 11 items, not {}", fields.len()))
    })?;
    let trace_id = hex_id::<16>(&trace_id, At::Field(index, "trace_id"))?;
    let span_id = hex_id::<8>(&span_id, At::Field(index, "span_id"))?;
    let parent_at = At::Field(index, "parent_span_id");
    let parent_str = parent.cast::<PyString>().map_err(|_| {
        PyTypeError::new_err(format!(
            "{parent_at} must be a str, not {}",
            type_name(&parent)
        ))
    })?;
    let parent = if parent_str.len()? == 0 {
        None
    } else {
        Some(hex_id::<8>(&parent, parent_at)?)
    };
    let name = text(&name, At::Field(index, "name"))?;
    let kind = uint(&kind, 5, At::Field(index, "kind"))?;
    let start = uint(&start, u64::MAX, At::Field(index, "start_ns"))?;
    let end = uint(&end, u64::MAX, At::Field(index, "end_ns"))?;
    let mut attrs = Vec::new();
    for (i, item) in items(&attributes, At::Field(index, "attributes"))?
        .iter()
        .enumerate()
    {
        let (key, value) = pair(item, At::Item(index, "attribute", i, ""))?;
        let key = text(&key, At::Item(index, "attribute", i, "key"))?;
        attrs.push((key, attribute(&value, index, i)?));
    }
    let mut span_links = Vec::new();
    for (i, item) in items(&links, At::Field(index, "links"))?.iter().enumerate() {
        let (link_trace, link_span) = pair(item, At::Item(index, "link", i, ""))?;
        span_links.push((
            hex_id::<16>(&link_trace, At::Item(index, "link", i, "trace_id"))?,
            hex_id::<8>(&link_span, At::Item(index, "link", i, "span_id"))?,
        ));
    }
    let status_code = uint(&status_code, 2, At::Field(index, "status_code"))?;
    let status_message = text(&status_message, At::Field(index, "status_message"))?;
    Ok(Span {
        trace_id,
        span_id,
        parent,
        name,
        kind,
        start,
        end,
        attributes: attrs,
        status_code,
        status_message,
        links: span_links,
    })
}

// --- encoding, without the GIL: sizes first, then one pass into an exact buffer ---------------

fn varint_len(mut n: u64) -> usize {
    let mut len = 1;
    while n >= 0x80 {
        n >>= 7;
        len += 1;
    }
    len
}

/// A length-delimited field's size (its tag is one byte: field numbers here are below 16).
fn ld_len(payload: usize) -> usize {
    1 + varint_len(payload as u64) + payload
}

/// An optional string field's size: nothing when empty (the proto3 default).
fn opt_str_len(s: &str) -> usize {
    if s.is_empty() { 0 } else { ld_len(s.len()) }
}

fn any_value_len(value: &Value) -> usize {
    match value {
        Value::Str(s) => ld_len(s.len()),
        Value::Bool(_) => 2,
        Value::Int(i) => 1 + varint_len(*i as u64),
        Value::Double(_) => 9,
    }
}

fn key_value_len(key: &str, value: &Value) -> usize {
    opt_str_len(key) + ld_len(any_value_len(value))
}

const LINK_LEN: usize = 18 + 10; // trace_id (1 + 1 + 16) and span_id (1 + 1 + 8)

fn status_len(span: &Span) -> usize {
    opt_str_len(&span.status_message) + if span.status_code != 0 { 2 } else { 0 }
}

fn span_len(span: &Span) -> usize {
    let mut len = ld_len(16) + ld_len(8);
    if span.parent.is_some() {
        len += ld_len(8);
    }
    len += opt_str_len(&span.name);
    if span.kind != 0 {
        len += 1 + varint_len(span.kind);
    }
    if span.start != 0 {
        len += 9;
    }
    if span.end != 0 {
        len += 9;
    }
    for (key, value) in &span.attributes {
        len += ld_len(key_value_len(key, value));
    }
    len += span.links.len() * ld_len(LINK_LEN);
    if span.status_code != 0 || !span.status_message.is_empty() {
        len += ld_len(status_len(span));
    }
    len
}

struct Writer(Vec<u8>);

impl Writer {
    fn varint(&mut self, mut n: u64) {
        while n >= 0x80 {
            self.0.push((n as u8) | 0x80);
            n >>= 7;
        }
        self.0.push(n as u8);
    }

    /// The tag and length of a length-delimited field; its payload is written next.
    fn head(&mut self, tag: u8, len: usize) {
        self.0.push(tag);
        self.varint(len as u64);
    }

    fn bytes(&mut self, tag: u8, payload: &[u8]) {
        self.head(tag, payload.len());
        self.0.extend_from_slice(payload);
    }

    fn opt_str(&mut self, tag: u8, s: &str) {
        if !s.is_empty() {
            self.bytes(tag, s.as_bytes());
        }
    }

    fn key_value(&mut self, key: &str, value: &Value) {
        self.opt_str(0x0A, key);
        self.head(0x12, any_value_len(value));
        match value {
            Value::Str(s) => self.bytes(0x0A, s.as_bytes()),
            Value::Bool(b) => self.0.extend_from_slice(&[0x10, u8::from(*b)]),
            Value::Int(i) => {
                self.0.push(0x18);
                self.varint(*i as u64);
            }
            Value::Double(d) => {
                self.0.push(0x21);
                self.0.extend_from_slice(&d.to_le_bytes());
            }
        }
    }

    fn span(&mut self, span: &Span) {
        self.bytes(0x0A, &span.trace_id);
        self.bytes(0x12, &span.span_id);
        if let Some(parent) = &span.parent {
            self.bytes(0x22, parent);
        }
        self.opt_str(0x2A, &span.name);
        if span.kind != 0 {
            self.0.push(0x30);
            self.varint(span.kind);
        }
        if span.start != 0 {
            self.0.push(0x39);
            self.0.extend_from_slice(&span.start.to_le_bytes());
        }
        if span.end != 0 {
            self.0.push(0x41);
            self.0.extend_from_slice(&span.end.to_le_bytes());
        }
        for (key, value) in &span.attributes {
            self.head(0x4A, key_value_len(key, value));
            self.key_value(key, value);
        }
        for (trace_id, span_id) in &span.links {
            self.head(0x6A, LINK_LEN);
            self.bytes(0x0A, trace_id);
            self.bytes(0x12, span_id);
        }
        if span.status_code != 0 || !span.status_message.is_empty() {
            self.head(0x7A, status_len(span));
            self.opt_str(0x12, &span.status_message);
            if span.status_code != 0 {
                self.0.push(0x18);
                self.varint(span.status_code);
            }
        }
    }
}

/// ExportTraceServiceRequest { resource_spans = 1: ResourceSpans { resource = 1: Resource
/// { attributes = 1 }, scope_spans = 2: ScopeSpans { scope = 1: InstrumentationScope { name = 1,
/// version = 2 }, spans = 2 } } }
fn encode(resource: &[(String, Value)], scope: &str, version: &str, spans: &[Span]) -> Vec<u8> {
    let resource_len: usize = resource
        .iter()
        .map(|(k, v)| ld_len(key_value_len(k, v)))
        .sum();
    let scope_len = opt_str_len(scope) + opt_str_len(version);
    let span_lens: Vec<usize> = spans.iter().map(span_len).collect();
    let scope_spans_len = ld_len(scope_len) + span_lens.iter().map(|&n| ld_len(n)).sum::<usize>();
    let resource_spans_len = ld_len(resource_len) + ld_len(scope_spans_len);
    let total = ld_len(resource_spans_len);

    let mut w = Writer(Vec::with_capacity(total));
    w.head(0x0A, resource_spans_len);
    w.head(0x0A, resource_len);
    for (key, value) in resource {
        w.head(0x0A, key_value_len(key, value));
        w.key_value(key, value);
    }
    w.head(0x12, scope_spans_len);
    w.head(0x0A, scope_len);
    w.opt_str(0x0A, scope);
    w.opt_str(0x12, version);
    for (span, &len) in spans.iter().zip(&span_lens) {
        w.head(0x12, len);
        w.span(span);
    }
    debug_assert_eq!(w.0.len(), total);
    w.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sizes_computed_first_are_the_bytes_written() {
        let span = Span {
            trace_id: [1; 16],
            span_id: [2; 8],
            parent: Some([3; 8]),
            name: "n".repeat(200),
            kind: 2,
            start: 1,
            end: u64::MAX,
            attributes: vec![
                ("a".into(), Value::Str("x".repeat(300))),
                ("".into(), Value::Bool(false)),
                ("i".into(), Value::Int(-1)),
                ("d".into(), Value::Double(0.5)),
            ],
            status_code: 2,
            status_message: "boom".into(),
            links: vec![([4; 16], [5; 8])],
        };
        let resource = vec![("service.name".to_string(), Value::Str("s".into()))];
        let len = span_len(&span);
        let body = encode(&resource, "cronoq", "1", &[span]);
        let resource_len = ld_len(key_value_len("service.name", &Value::Str("s".into())));
        let scope_spans = ld_len(ld_len(6) + ld_len(1)) + ld_len(len);
        assert_eq!(
            body.len(),
            ld_len(ld_len(resource_len) + ld_len(scope_spans))
        );
        assert_eq!(body[0], 0x0A);
    }

    #[test]
    fn varints() {
        let mut w = Writer(Vec::new());
        w.varint(300);
        assert_eq!(w.0, [0xAC, 0x02]);
        assert_eq!(varint_len(300), 2);
        assert_eq!(varint_len(u64::MAX), 10);
    }
}
