//! `redis://` table addresses: the nodes to start from, the credentials,
//! the table's name and the client's bounds.
//!
//! `redis://[USER[:PASSWORD]@]HOST:PORT[,HOST:PORT...]/NAME[?OPTIONS]`,
//! options `timeout_ms` (each read and write, default 2000),
//! `connect_timeout_ms` (default 1000), `retries` (rounds after the first,
//! default 3), `replicas` (`fallback`, the default: read a slot's replica
//! when its master does not answer; `prefer`: read replicas first; `never`).
//! The password may instead come from `PLEIO_REDIS_PASSWORD`, so it stays
//! out of process listings. User and password are percent-decoded.
//!
//! `rediss://` is the same over TLS, with options `tls_ca=PATH` (the PEM
//! certificates to trust; default: the system's bundle), `tls_cert=PATH`
//! and `tls_key=PATH` (a client certificate, for servers that ask for one)
//! and `tls_name=NAME` (the name every node's certificate must carry;
//! default: the host each node is reached at, a name or an IP address).

use std::fmt;
use std::time::Duration;

use super::RemoteError;

/// The environment variable a password may come from.
pub const PASSWORD_ENV: &str = "PLEIO_REDIS_PASSWORD";

/// Where reads go when a slot has replicas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplicaReads {
    /// Masters first; a slot's replicas when its master does not answer.
    Fallback,
    /// Replicas first (spreads load; safe: published rows never change,
    /// and every row is checked).
    Prefer,
    /// Masters only.
    Never,
}

/// The client's bounds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientOptions {
    /// Each read and write on a connection.
    pub timeout: Duration,
    /// Each connection attempt.
    pub connect_timeout: Duration,
    /// Rounds of retries after the first attempt (after a moved slot, a
    /// failed node or a timeout).
    pub retries: u32,
    /// Replica reads.
    pub replicas: ReplicaReads,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            timeout: Duration::from_millis(2000),
            connect_timeout: Duration::from_millis(1000),
            retries: 3,
            replicas: ReplicaReads::Fallback,
        }
    }
}

/// TLS settings of a `rediss://` address (paths as given, read at connect).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsOptions {
    /// PEM certificates to trust (`None`: the system's bundle).
    pub ca: Option<std::path::PathBuf>,
    /// PEM client certificate chain, with `key`.
    pub cert: Option<std::path::PathBuf>,
    /// PEM private key of `cert`.
    pub key: Option<std::path::PathBuf>,
    /// The name the nodes' certificates must carry (`None`: each node's host).
    pub name: Option<String>,
}

/// A parsed `redis://` address.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisUrl {
    /// `host:port` of the nodes to start from.
    pub seeds: Vec<String>,
    /// ACL user (`None`: the default user).
    pub user: Option<String>,
    /// Password (`None`: no `AUTH`).
    pub password: Option<String>,
    /// The table's name (empty when the address names none).
    pub name: String,
    /// The client's bounds.
    pub options: ClientOptions,
    /// A local copy of the table (`local=PATH`): the next tier.
    pub local: Option<std::path::PathBuf>,
    /// `order=local,redis`: the local copy first, Redis when it fails
    /// (default with `local`: `redis,local`).
    pub local_first: bool,
    /// TLS (`rediss://`), or `None` for plain TCP.
    pub tls: Option<TlsOptions>,
}

impl fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

/// Without the password.
impl fmt::Display for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.tls.is_some() { "rediss://" } else { "redis://" })?;
        if let Some(u) = &self.user {
            write!(f, "{u}@")?;
        }
        write!(f, "{}/{}", self.seeds.join(","), self.name)
    }
}

/// True when `s` is a remote table address (`redis://` or `rediss://`).
pub fn is_remote(s: &str) -> bool {
    s.starts_with("redis://") || s.starts_with("rediss://")
}

fn url_err(url: &str, what: impl Into<String>) -> RemoteError {
    RemoteError::Url {
        url: redact(url),
        what: what.into(),
    }
}

/// `url` with any password replaced by `***`.
pub fn redact(url: &str) -> String {
    let Some(rest) = url.split_once("://").map(|(_, r)| r) else {
        return url.to_string();
    };
    let auth_end = rest.find('/').unwrap_or(rest.len());
    match rest[..auth_end].rfind('@') {
        Some(at) => match rest[..at].split_once(':') {
            Some((user, _)) => {
                let scheme = &url[..url.len() - rest.len()];
                format!("{scheme}{user}:***{}", &rest[at..])
            }
            None => url.to_string(),
        },
        None => url.to_string(),
    }
}

fn percent_decode(url: &str, s: &str) -> Result<String, RemoteError> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| url_err(url, "a % not followed by two hex digits"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| url_err(url, "user or password is not UTF-8"))
}

fn millis(url: &str, key: &str, v: &str) -> Result<Duration, RemoteError> {
    match v.parse::<u64>() {
        Ok(ms) if (1..=3_600_000).contains(&ms) => Ok(Duration::from_millis(ms)),
        _ => Err(url_err(
            url,
            format!("{key}={v}: give milliseconds, 1 to 3600000"),
        )),
    }
}

impl RedisUrl {
    /// Parses `url`; `env_password` is used when the address has none.
    pub fn parse_with(url: &str, env_password: Option<String>) -> Result<RedisUrl, RemoteError> {
        let (rest, mut tls) = match (url.strip_prefix("redis://"), url.strip_prefix("rediss://")) {
            (Some(r), _) => (r, None),
            (_, Some(r)) => (r, Some(TlsOptions::default())),
            _ => return Err(url_err(url, "not a redis:// or rediss:// address")),
        };
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        let (authority, name) = match rest.split_once('/') {
            Some((a, n)) => (a, n),
            None => (rest, ""),
        };
        if name.contains('/') || name.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(url_err(url, format!("table name {name:?}: no '/', spaces or control characters")));
        }
        let (cred, hosts) = match authority.rfind('@') {
            Some(at) => (Some(&authority[..at]), &authority[at + 1..]),
            None => (None, authority),
        };
        let (mut user, mut password) = (None, None);
        if let Some(cred) = cred {
            match cred.split_once(':') {
                Some((u, p)) => {
                    if !u.is_empty() {
                        user = Some(percent_decode(url, u)?);
                    }
                    password = Some(percent_decode(url, p)?);
                }
                None if !cred.is_empty() => user = Some(percent_decode(url, cred)?),
                None => {}
            }
        }
        if password.is_none() {
            password = env_password.filter(|p| !p.is_empty());
        }
        let mut seeds = Vec::new();
        for h in hosts.split(',') {
            let (host, port) = h
                .rsplit_once(':')
                .ok_or_else(|| url_err(url, format!("node {h:?}: give HOST:PORT")))?;
            let port_ok = port.parse::<u16>().is_ok_and(|p| p != 0);
            if host.is_empty() || !port_ok {
                return Err(url_err(url, format!("node {h:?}: give HOST:PORT (port 1-65535)")));
            }
            seeds.push(h.to_string());
        }
        let mut options = ClientOptions::default();
        let (mut local, mut order) = (None, None);
        for kv in query.into_iter().flat_map(|q| q.split('&')).filter(|s| !s.is_empty()) {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            match k {
                "timeout_ms" => options.timeout = millis(url, k, v)?,
                "connect_timeout_ms" => options.connect_timeout = millis(url, k, v)?,
                "retries" => {
                    options.retries = v
                        .parse()
                        .ok()
                        .filter(|r| *r <= 100)
                        .ok_or_else(|| url_err(url, format!("retries={v}: give 0 to 100")))?
                }
                "local" if !v.is_empty() => {
                    local = Some(std::path::PathBuf::from(percent_decode(url, v)?))
                }
                "order" => {
                    order = match v {
                        "redis,local" => Some(false),
                        "local,redis" => Some(true),
                        _ => {
                            return Err(url_err(
                                url,
                                format!("order={v}: give redis,local or local,redis"),
                            ))
                        }
                    }
                }
                "tls_ca" | "tls_cert" | "tls_key" | "tls_name" => {
                    let t = tls.as_mut().ok_or_else(|| {
                        url_err(url, format!("{k}: TLS options need a rediss:// address"))
                    })?;
                    if v.is_empty() {
                        return Err(url_err(url, format!("{k}= is empty")));
                    }
                    let v = percent_decode(url, v)?;
                    match k {
                        "tls_ca" => t.ca = Some(v.into()),
                        "tls_cert" => t.cert = Some(v.into()),
                        "tls_key" => t.key = Some(v.into()),
                        _ => t.name = Some(v),
                    }
                }
                "replicas" => {
                    options.replicas = match v {
                        "fallback" => ReplicaReads::Fallback,
                        "prefer" => ReplicaReads::Prefer,
                        "never" => ReplicaReads::Never,
                        _ => {
                            return Err(url_err(
                                url,
                                format!("replicas={v}: give fallback, prefer or never"),
                            ))
                        }
                    }
                }
                _ => {
                    return Err(url_err(
                        url,
                        format!("unknown option {k:?} (timeout_ms, connect_timeout_ms, retries, replicas, local, order, tls_ca, tls_cert, tls_key, tls_name)"),
                    ))
                }
            }
        }
        if let Some(t) = &tls {
            if t.cert.is_some() != t.key.is_some() {
                return Err(url_err(url, "give tls_cert and tls_key together (a client certificate and its key)"));
            }
        }
        if order.is_some() && local.is_none() {
            return Err(url_err(url, "order= needs local=PATH, the local copy"));
        }
        Ok(RedisUrl {
            seeds,
            user,
            password,
            name: name.to_string(),
            options,
            local,
            local_first: order.unwrap_or(false),
            tls,
        })
    }

    /// Parses `url`, the password from [`PASSWORD_ENV`] when it has none.
    pub fn parse(url: &str) -> Result<RedisUrl, RemoteError> {
        RedisUrl::parse_with(url, std::env::var(PASSWORD_ENV).ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_nodes_credentials_name_and_options() {
        let u = RedisUrl::parse_with(
            "redis://ple:p%40ss@10.0.0.1:7000,10.0.0.2:7001/qwen?timeout_ms=50&retries=1&replicas=prefer",
            None,
        )
        .unwrap();
        assert_eq!(u.seeds, ["10.0.0.1:7000", "10.0.0.2:7001"]);
        assert_eq!(u.user.as_deref(), Some("ple"));
        assert_eq!(u.password.as_deref(), Some("p@ss"));
        assert_eq!(u.name, "qwen");
        assert_eq!(u.options.timeout, Duration::from_millis(50));
        assert_eq!(u.options.retries, 1);
        assert_eq!(u.options.replicas, ReplicaReads::Prefer);
        assert_eq!(u.to_string(), "redis://ple@10.0.0.1:7000,10.0.0.2:7001/qwen");
        let t = RedisUrl::parse_with("redis://h:1/t?local=/m/a%20b.gguf&order=local,redis", None).unwrap();
        assert_eq!(t.local.as_deref(), Some(std::path::Path::new("/m/a b.gguf")));
        assert!(t.local_first);
        let t = RedisUrl::parse_with("redis://h:1/t?local=/m/x.gguf", None).unwrap();
        assert!(!t.local_first);
        let e = RedisUrl::parse_with("redis://127.0.0.1:1/t", Some("pw".into())).unwrap();
        assert_eq!(e.password.as_deref(), Some("pw"));
        assert_eq!(e.user, None);
        assert_eq!(e.tls, None);
        let s = RedisUrl::parse_with(
            "rediss://u:pw@h:1/t?tls_ca=/c/ca.pem&tls_cert=/c/me.pem&tls_key=/c/me%2Bkey.pem&tls_name=redis.lan",
            None,
        )
        .unwrap();
        let t = s.tls.as_ref().unwrap();
        assert_eq!(t.ca.as_deref(), Some(std::path::Path::new("/c/ca.pem")));
        assert_eq!(t.key.as_deref(), Some(std::path::Path::new("/c/me+key.pem")));
        assert_eq!(t.name.as_deref(), Some("redis.lan"));
        assert_eq!(s.to_string(), "rediss://u@h:1/t");
        assert_eq!(RedisUrl::parse_with("rediss://h:1/t", None).unwrap().tls, Some(TlsOptions::default()));
    }

    #[test]
    fn refuses_bad_addresses_naming_the_part() {
        for (url, part) in [
            ("http://h:1/t", "not a redis"),
            ("redis://h:1/t?tls_ca=/c.pem", "need a rediss://"),
            ("rediss://h:1/t?tls_cert=/c.pem", "together"),
            ("rediss://h:1/t?tls_ca=", "empty"),
            ("redis://h/t", "HOST:PORT"),
            ("redis://h:0/t", "port"),
            ("redis://h:1/a/b", "table name"),
            ("redis://h:1/t?timeout_ms=0", "timeout_ms"),
            ("redis://h:1/t?replicas=some", "replicas"),
            ("redis://h:1/t?colour=red", "unknown option"),
            ("redis://u:%zz@h:1/t", "hex"),
            ("redis://h:1/t?order=local,redis", "needs local"),
            ("redis://h:1/t?local=/x&order=up", "order=up"),
        ] {
            let e = RedisUrl::parse_with(url, None).unwrap_err().to_string();
            assert!(e.contains(part), "{url}: {e}");
        }
        let e = RedisUrl::parse_with("redis://u:secret@h:1/t?x=1", None)
            .unwrap_err()
            .to_string();
        assert!(!e.contains("secret") && e.contains("u:***@h:1"), "{e}");
    }
}
