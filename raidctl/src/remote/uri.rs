//! NBD URIs (the NBD project's doc/uri.md, as libnbd and qemu read them):
//! `nbd://HOST[:PORT]/EXPORT`, `nbds://...` (TLS), and
//! `nbd+unix:///EXPORT?socket=PATH` (`nbds+unix` with TLS). The export name
//! is the path after the first `/`, percent-decoded; the port defaults to
//! 10809. Query parameters read here: `socket`, `tls-certificates` (a
//! directory holding `ca-cert.pem`, and `client-cert.pem` with
//! `client-key.pem` where the server asks for a client certificate, as
//! libnbd and qemu lay it out) and `tls-hostname` (the name the server's
//! certificate must carry, when it is not the host in the URI).

use std::path::PathBuf;

/// Where an NBD export is and how to reach it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct NbdUri {
    pub addr: Addr,
    pub export: String,
    /// TLS asked for (`nbds`): certificates from this directory, or the
    /// system's roots when none is given.
    pub tls: Option<TlsClient>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Addr {
    Tcp { host: String, port: u16 },
    Unix(PathBuf),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TlsClient {
    pub certificates: Option<PathBuf>,
    /// The name checked against the server's certificate.
    pub hostname: String,
}

pub const DEFAULT_PORT: u16 = 10809;

impl NbdUri {
    /// A short name for a column (`raidctl iostat`): where the export is
    /// and its name, without the query (the last part of a certificates
    /// directory would read as the device).
    pub fn short(&self) -> String {
        let at = match &self.addr {
            Addr::Tcp { host, port } if *port == DEFAULT_PORT => host.clone(),
            Addr::Tcp { host, port } if host.contains(':') => format!("[{host}]:{port}"),
            Addr::Tcp { host, port } => format!("{host}:{port}"),
            Addr::Unix(p) => p
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_else(|| p.display().to_string()),
        };
        match self.export.is_empty() {
            true => at,
            false => format!("{at}/{}", self.export),
        }
    }
}

/// Whether `s` is meant as an NBD URI (and so not a path).
pub fn looks_like_uri(s: &str) -> bool {
    ["nbd://", "nbds://", "nbd+unix://", "nbds+unix://"]
        .iter()
        .any(|p| s.starts_with(p))
}

impl NbdUri {
    /// Parses one URI; the error names what is wrong and the form expected.
    pub fn parse(s: &str) -> Result<NbdUri, String> {
        let bad = |why: &str| {
            format!("'{s}' is not an NBD URI: {why} (nbd://HOST[:PORT]/EXPORT, nbds://... for TLS, nbd+unix:///EXPORT?socket=PATH)")
        };
        let (scheme, rest) = s.split_once("://").ok_or_else(|| bad("no scheme"))?;
        let (tls, unix) = match scheme {
            "nbd" => (false, false),
            "nbds" => (true, false),
            "nbd+unix" => (false, true),
            "nbds+unix" => (true, true),
            _ => return Err(bad(&format!("unknown scheme '{scheme}'"))),
        };
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        if rest.contains('#') {
            return Err(bad("fragments are not allowed"));
        }
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, ""),
        };
        let export = decode(path).ok_or_else(|| bad("bad percent-encoding in the export name"))?;
        let mut socket = None;
        let mut certificates = None;
        let mut tls_hostname = None;
        for kv in query
            .into_iter()
            .flat_map(|q| q.split('&'))
            .filter(|x| !x.is_empty())
        {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            let v = decode(v).ok_or_else(|| bad("bad percent-encoding in a query parameter"))?;
            match k {
                "socket" => socket = Some(PathBuf::from(v)),
                "tls-certificates" => certificates = Some(PathBuf::from(v)),
                "tls-hostname" => tls_hostname = Some(v),
                _ => return Err(bad(&format!("unknown query parameter '{k}'"))),
            }
        }
        let addr = if unix {
            if !authority.is_empty() {
                return Err(bad(
                    "a Unix socket URI has no host (three slashes: nbd+unix:///EXPORT)",
                ));
            }
            Addr::Unix(socket.ok_or_else(|| bad("no socket=PATH"))?)
        } else {
            if socket.is_some() {
                return Err(bad("socket= is only for nbd+unix://"));
            }
            let (host, port) = split_host_port(authority).ok_or_else(|| bad("bad host or port"))?;
            if host.is_empty() {
                return Err(bad("no host"));
            }
            Addr::Tcp { host, port }
        };
        if !tls && (certificates.is_some() || tls_hostname.is_some()) {
            return Err(bad("TLS parameters need the nbds scheme"));
        }
        let tls = tls.then(|| TlsClient {
            certificates,
            hostname: tls_hostname.unwrap_or_else(|| match &addr {
                Addr::Tcp { host, .. } => host.clone(),
                Addr::Unix(_) => "localhost".into(),
            }),
        });
        Ok(NbdUri { addr, export, tls })
    }

    /// Where it is, for messages: "10.0.0.2:10809" or the socket's path.
    pub fn place(&self) -> String {
        match &self.addr {
            Addr::Tcp { host, port } if host.contains(':') => format!("[{host}]:{port}"),
            Addr::Tcp { host, port } => format!("{host}:{port}"),
            Addr::Unix(p) => p.display().to_string(),
        }
    }
}

/// "host", "host:port", "[v6]", "[v6]:port".
fn split_host_port(a: &str) -> Option<(String, u16)> {
    if let Some(r) = a.strip_prefix('[') {
        let (h, after) = r.split_once(']')?;
        let port = match after {
            "" => DEFAULT_PORT,
            p => p.strip_prefix(':')?.parse().ok()?,
        };
        return Some((h.to_string(), port));
    }
    match a.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => Some((h.to_string(), p.parse().ok()?)),
        Some(_) => None,
        None => Some((a.to_string(), DEFAULT_PORT)),
    }
}

fn decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let h = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(h, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms() {
        let u = NbdUri::parse("nbd://10.1.0.2/disk%201").unwrap();
        assert_eq!(
            u.addr,
            Addr::Tcp {
                host: "10.1.0.2".into(),
                port: 10809
            }
        );
        assert_eq!(u.export, "disk 1");
        assert!(u.tls.is_none());
        let u = NbdUri::parse("nbds://[fd00::2]:7000/x?tls-certificates=/etc/pki/nbd").unwrap();
        assert_eq!(u.short(), "[fd00::2]:7000/x");
        assert_eq!(
            NbdUri::parse("nbd+unix:///disk?socket=/run/a.sock")
                .unwrap()
                .short(),
            "a.sock/disk"
        );
        assert_eq!(NbdUri::parse("nbd://h/e").unwrap().short(), "h/e");
        assert_eq!(u.place(), "[fd00::2]:7000");
        let t = u.tls.unwrap();
        assert_eq!(t.hostname, "fd00::2");
        assert_eq!(t.certificates.unwrap(), PathBuf::from("/etc/pki/nbd"));
        let u = NbdUri::parse("nbd+unix:///?socket=/run/a.sock").unwrap();
        assert_eq!(u.addr, Addr::Unix("/run/a.sock".into()));
        assert_eq!(u.export, "");
        assert_eq!(NbdUri::parse("nbd://h:99").unwrap().export, "");
    }

    #[test]
    fn refusals_say_what_is_wrong() {
        for (s, why) in [
            ("nbd+unix:///x", "socket"),
            ("nbd+unix://host/x?socket=/a", "no host"),
            ("nbd://h:notaport/x", "port"),
            ("nbd:///x", "no host"),
            ("nbd://h/x?tls-certificates=/d", "nbds"),
            ("nbd://h/x?foo=1", "foo"),
            ("nbd://h/%zz", "percent"),
            ("http://h/x", "scheme"),
        ] {
            let e = NbdUri::parse(s).unwrap_err();
            assert!(e.contains(why), "{s}: {e}");
        }
    }

    #[test]
    fn only_uris_look_like_uris() {
        assert!(looks_like_uri("nbd://h/x"));
        assert!(looks_like_uri("nbds+unix:///x?socket=/s"));
        assert!(!looks_like_uri("/dev/nvme0n1"));
        assert!(!looks_like_uri("nbd.img"));
    }
}
