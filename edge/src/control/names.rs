//! Validation of the names callers reserve: subdomain labels, custom host
//! names, TCP aliases, token labels. Pure functions; every refusal says why.

use crate::error::{Error, Result};

/// Subdomains nobody may reserve: they name the edge itself or are names
/// users would be misled by (`www`, `api`, mail hosts…).
pub const RESERVED_SUBDOMAINS: &[&str] = &[
    "www",
    "api",
    "edge",
    "admin",
    "tuna",
    "mail",
    "smtp",
    "imap",
    "pop",
    "ftp",
    "mx",
    "ns",
    "ns1",
    "ns2",
    "dns",
    "status",
    "localhost",
    "autoconfig",
    "autodiscover",
];

/// Whether `label` is an RFC 1123 DNS label: 1–63 of `a-z0-9-`, no leading
/// or trailing hyphen (callers lower-case first).
pub fn is_dns_label(label: &str) -> bool {
    !label.is_empty()
        && label.len() <= 63
        && label
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !label.starts_with('-')
        && !label.ends_with('-')
}

/// Lower-cases `name` and strips one trailing dot: DNS names compare
/// case-insensitively and `example.com.` is `example.com`.
pub fn normalize_host(name: &str) -> String {
    name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase()
}

/// Checks a subdomain label and returns `<label>.<base>`; the edge's own
/// public host is never a subdomain anyone may hold.
pub fn subdomain_host(label: &str, base_domain: &str, public_host: &str) -> Result<String> {
    let label = label.to_ascii_lowercase();
    if label.contains('.') {
        return Err(Error::InvalidName(format!(
            "subdomain {label:?} must be a single DNS label (no dots); use `domain` for a custom host name"
        )));
    }
    if !is_dns_label(&label) {
        return Err(Error::InvalidName(format!(
            "subdomain {label:?} is not an RFC 1123 label: 1-63 characters of a-z, 0-9 and '-', not starting or ending with '-'"
        )));
    }
    if RESERVED_SUBDOMAINS.contains(&label.as_str()) {
        return Err(Error::InvalidName(format!(
            "subdomain {label:?} is reserved; choose another name"
        )));
    }
    let host = format!("{label}.{base_domain}");
    if host == public_host {
        return Err(Error::InvalidName(format!(
            "{host:?} is the edge's own public host name; choose another name"
        )));
    }
    Ok(host)
}

/// Checks a fully qualified host name (RFC 1123): at most 253 characters, at
/// least two labels, not an IP address. Returns it normalised.
pub fn host_name(name: &str) -> Result<String> {
    let host = normalize_host(name);
    let invalid = |why: &str| Error::InvalidName(format!("host name {name:?} is invalid: {why}"));
    if host.is_empty() || host.len() > 253 {
        return Err(invalid("it must have 1 to 253 characters"));
    }
    let labels: Vec<&str> = host.split('.').collect();
    if labels.len() < 2 {
        return Err(invalid("it needs at least two labels (name.tld)"));
    }
    if let Some(bad) = labels.iter().find(|l| !is_dns_label(l)) {
        return Err(invalid(&format!(
            "label {bad:?} is not an RFC 1123 label (a-z, 0-9, '-'; no wildcards)"
        )));
    }
    if labels
        .last()
        .is_some_and(|tld| tld.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err(invalid("IP addresses cannot be reserved"));
    }
    Ok(host)
}

/// Checks a custom domain against the edge's own names.
pub fn custom_domain(name: &str, base_domain: &str, public_host: &str) -> Result<String> {
    let host = host_name(name)?;
    if host == base_domain || host.ends_with(&format!(".{base_domain}")) {
        return Err(Error::InvalidName(format!(
            "{host:?} lies under the edge's base domain {base_domain:?}; reserve it with `subdomain` instead"
        )));
    }
    if host == public_host {
        return Err(Error::InvalidName(format!(
            "{host:?} is the edge's own public host name"
        )));
    }
    Ok(host)
}

/// Checks a TCP endpoint alias: a DNS label that starts with a letter, so a
/// path segment of digits always means a port.
pub fn tcp_alias(alias: &str) -> Result<String> {
    let alias = alias.to_ascii_lowercase();
    if !is_dns_label(&alias) || !alias.starts_with(|c: char| c.is_ascii_lowercase()) {
        return Err(Error::InvalidName(format!(
            "alias {alias:?} must be an RFC 1123 label starting with a letter (a-z, 0-9, '-', at most 63 characters)"
        )));
    }
    Ok(alias)
}

/// Checks a token label key or value: 1–63 (keys) or 0–63 (values) of
/// `A-Za-z0-9-_.` with an optional `prefix/` on keys, like Kubernetes labels.
pub fn label(key: &str, value: &str) -> Result<()> {
    fn segment_ok(s: &str, allow_empty: bool) -> bool {
        (allow_empty || !s.is_empty())
            && s.len() <= 63
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    }
    let name = key.rsplit_once('/').map_or(key, |(prefix, name)| {
        let prefix_ok = prefix.len() <= 253 && prefix.split('.').all(is_dns_label);
        if prefix_ok { name } else { "" }
    });
    if !segment_ok(name, false) || !segment_ok(value, true) {
        return Err(Error::InvalidRequest(format!(
            "label {key:?}={value:?} is invalid: keys are [prefix/]name, names and values at most 63 characters of A-Z, a-z, 0-9, '-', '_', '.'"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_follow_rfc_1123() {
        for (label, ok) in [
            ("a", true),
            ("app-1", true),
            ("0abc", true),
            ("-app", false),
            ("app-", false),
            ("", false),
            ("App", false),
            ("a_b", false),
            (&"a".repeat(63), true),
            (&"a".repeat(64), false),
        ] {
            assert_eq!(is_dns_label(label), ok, "{label:?}");
        }
    }

    #[test]
    fn subdomains() {
        assert_eq!(
            subdomain_host("App", "tuna.test", "gate.tuna.test").unwrap(),
            "app.tuna.test"
        );
        for bad in ["www", "api", "edge", "a.b", "-x", "", "x_y", "gate"] {
            assert!(
                matches!(
                    subdomain_host(bad, "tuna.test", "gate.tuna.test"),
                    Err(Error::InvalidName(_))
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn custom_domains() {
        assert_eq!(
            custom_domain("App.Example.COM.", "tuna.test", "edge.tuna.test").unwrap(),
            "app.example.com"
        );
        for bad in [
            "example",
            "*.example.com",
            "a..com",
            "foo.tuna.test",
            "tuna.test",
            "10.0.0.1",
            "exa mple.com",
        ] {
            assert!(
                custom_domain(bad, "tuna.test", "edge.tuna.test").is_err(),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn aliases_and_labels() {
        assert_eq!(tcp_alias("Db").unwrap(), "db");
        assert!(tcp_alias("5432").is_err());
        assert!(tcp_alias("db_1").is_err());
        assert!(label("k8s.tuna.am/namespace", "default").is_ok());
        assert!(label("owner", "").is_ok());
        assert!(label("", "x").is_err());
        assert!(label("a=b", "x").is_err());
        assert!(label("k", "x,y").is_err());
    }
}
