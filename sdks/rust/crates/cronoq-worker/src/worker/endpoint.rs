//! Endpoints and the safety rules of shard redirects (docs/worker.md, "Shard redirects").

use std::net::IpAddr;

/// A parsed `http://` or `https://` endpoint naming a bare host and port.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Target {
    /// `scheme://authority`, as the channel is built from it.
    pub(crate) uri: String,
    pub(crate) secure: bool,
    host: String,
}

impl Target {
    /// Reads an endpoint; the reason says what is wrong with it.
    pub(crate) fn parse(endpoint: &str) -> Result<Self, &'static str> {
        let (scheme, rest) = endpoint
            .split_once("://")
            .ok_or("not an http:// or https:// endpoint")?;
        let secure = match scheme.to_ascii_lowercase().as_str() {
            "http" => false,
            "https" => true,
            _ => return Err("not an http:// or https:// endpoint"),
        };
        let authority = rest.strip_suffix('/').unwrap_or(rest);
        let host = match authority.strip_prefix('[') {
            Some(v6) => v6.split_once(']').map_or("", |(host, _)| host),
            None => authority
                .rsplit_once(':')
                .map_or(authority, |(host, _)| host),
        };
        if host.is_empty() || authority.contains(['@', '/', '?', '#']) {
            return Err("not a plain host and port");
        }
        Ok(Self {
            uri: format!("{}://{authority}", scheme.to_ascii_lowercase()),
            secure,
            host: host.to_owned(),
        })
    }

    /// Whether plain text to this host stays on this machine.
    pub(crate) fn loopback(&self) -> bool {
        self.host.eq_ignore_ascii_case("localhost")
            || self.host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
    }
}

/// Why a redirect from `current` to `target` must not be followed, if it must not: never
/// from TLS down to plain text, and a token over plain text only to loopback unless
/// `insecure_http` allows it.
pub(crate) fn refuse_redirect(
    current: &Target,
    target: &Target,
    has_token: bool,
    insecure_http: bool,
) -> Option<&'static str> {
    if target.secure {
        return None;
    }
    if current.secure {
        return Some("would move from TLS to plain http");
    }
    if has_token && !target.loopback() && !insecure_http {
        return Some("would send the token over plain http to another host");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_plain_hosts_and_ports_only() {
        for (endpoint, uri, loopback) in [
            ("http://127.0.0.1:7070", "http://127.0.0.1:7070", true),
            (
                "HTTPS://Cronoq.internal:7070/",
                "https://Cronoq.internal:7070",
                false,
            ),
            ("http://[::1]:7070", "http://[::1]:7070", true),
            ("http://localhost", "http://localhost", true),
            (
                "http://localhost.example.com:1",
                "http://localhost.example.com:1",
                false,
            ),
        ] {
            let t = Target::parse(endpoint).unwrap();
            assert_eq!(
                (t.uri.as_str(), t.loopback()),
                (uri, loopback),
                "{endpoint}"
            );
        }
        for (endpoint, why) in [
            ("grpc://127.0.0.1:1", "not an http:// or https:// endpoint"),
            ("127.0.0.1:1", "not an http:// or https:// endpoint"),
            ("http://user:pw@127.0.0.1:1", "not a plain host and port"),
            ("http://127.0.0.1:1/cronoq", "not a plain host and port"),
            ("http://127.0.0.1:1?x", "not a plain host and port"),
            ("http://", "not a plain host and port"),
        ] {
            assert_eq!(Target::parse(endpoint), Err(why), "{endpoint}");
        }
    }

    #[test]
    fn redirect_rules() {
        let t = |s| Target::parse(s).unwrap();
        let (https, http) = (t("https://a:1"), t("http://a:1"));
        assert_eq!(
            refuse_redirect(&https, &t("http://127.0.0.1:2"), false, true),
            Some("would move from TLS to plain http")
        );
        assert_eq!(refuse_redirect(&http, &t("https://b:2"), true, false), None);
        assert_eq!(
            refuse_redirect(&http, &t("http://127.0.0.2:2"), true, false),
            None
        );
        assert_eq!(refuse_redirect(&http, &t("http://b:2"), false, false), None);
        assert_eq!(
            refuse_redirect(&http, &t("http://b:2"), true, false),
            Some("would send the token over plain http to another host")
        );
        assert_eq!(refuse_redirect(&http, &t("http://b:2"), true, true), None);
    }
}
