//! TLS on the NBD export and on network members: certificates made with
//! openssl; clients with and without a client certificate, or without
//! TLS; a server certificate that expired; serving a network address
//! without TLS only when told to.

use raid_e2e::hosts::{wait_for, Server};
use raid_e2e::{free_port, need, run_ok, World};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const MIB: u64 = 1 << 20;

/// A certificate authority, a server certificate for 127.0.0.1 and
/// `192.0.2.0/24`'s hosts, and a client certificate, made with openssl,
/// laid out as qemu and nbdkit read them.
struct Pki {
    server: PathBuf,
    client: PathBuf,
    /// The CA alone: a client with no certificate of its own.
    anonymous: PathBuf,
}

/// Runs openssl in `dir`; it must succeed.
fn openssl(dir: &Path, args: &[&str]) {
    let o = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

fn pki(dir: &Path) -> Pki {
    need("openssl");
    let run = |args: &[&str]| openssl(dir, args);
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let mut a = vec!["req", "-x509"];
    a.extend(ec);
    a.extend([
        "-keyout",
        "ca-key.pem",
        "-out",
        "ca-cert.pem",
        "-days",
        "2",
        "-subj",
        "/CN=test CA",
    ]);
    run(&a);
    let mut sans = "subjectAltName=IP:127.0.0.1,DNS:localhost".to_string();
    for i in 1..=10 {
        sans.push_str(&format!(",IP:192.0.2.{i}"));
    }
    std::fs::write(
        dir.join("s.ext"),
        format!("{sans}\nextendedKeyUsage=serverAuth\n"),
    )
    .unwrap();
    std::fs::write(dir.join("c.ext"), "extendedKeyUsage=clientAuth\n").unwrap();
    for (who, cn) in [("server", "localhost"), ("client", "client")] {
        let mut a = vec!["req"];
        a.extend(ec);
        let key = format!("{who}-key.pem");
        let csr = format!("{who}.csr");
        let subj = format!("/CN={cn}");
        a.extend(["-keyout", &key, "-out", &csr, "-subj", &subj]);
        run(&a);
        let cert = format!("{who}-cert.pem");
        let ext = if who == "server" { "s.ext" } else { "c.ext" };
        run(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca-cert.pem",
            "-CAkey",
            "ca-key.pem",
            "-CAcreateserial",
            "-out",
            &cert,
            "-days",
            "2",
            "-extfile",
            ext,
        ]);
        let d = dir.join(who);
        std::fs::create_dir_all(&d).unwrap();
        for f in [key, cert, "ca-cert.pem".to_string()] {
            std::fs::copy(dir.join(&f), d.join(&f)).unwrap();
        }
    }
    let anonymous = dir.join("anonymous");
    std::fs::create_dir_all(&anonymous).unwrap();
    std::fs::copy(dir.join("ca-cert.pem"), anonymous.join("ca-cert.pem")).unwrap();
    Pki {
        server: dir.join("server"),
        client: dir.join("client"),
        anonymous,
    }
}

/// A folder with a server certificate that expired on 2020-01-02 (made
/// with `openssl ca`, which takes explicit dates), or None without openssl.
fn expired_server_certificate(dir: &Path) -> Option<PathBuf> {
    if Command::new("openssl").arg("version").output().is_err() {
        eprintln!("SKIPPED: the expired-certificate check needs openssl");
        return None;
    }
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("index.txt"), "").unwrap();
    std::fs::write(dir.join("serial"), "01\n").unwrap();
    std::fs::write(
        dir.join("ca.cnf"),
        "[ca]\ndefault_ca = d\n[d]\ndatabase = index.txt\nnew_certs_dir = .\nserial = serial\ndefault_md = sha256\npolicy = p\n[p]\ncommonName = supplied\n",
    )
    .unwrap();
    for args in [
        &[
            "req",
            "-new",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            "server-key.pem",
            "-out",
            "s.csr",
            "-subj",
            "/CN=localhost",
        ][..],
        &[
            "ca",
            "-batch",
            "-notext",
            "-config",
            "ca.cnf",
            "-selfsign",
            "-keyfile",
            "server-key.pem",
            "-in",
            "s.csr",
            "-out",
            "server-cert.pem",
            "-startdate",
            "20200101000000Z",
            "-enddate",
            "20200102000000Z",
        ][..],
    ] {
        openssl(dir, args);
    }
    Some(dir.to_path_buf())
}

fn qemu_io_tls(port: u16, export: &str, creds: &Path, cmds: &[&str]) -> (bool, String) {
    let mut c = Command::new("qemu-io");
    c.arg("--object")
        .arg(format!(
            "tls-creds-x509,id=tls0,endpoint=client,dir={}",
            creds.display()
        ))
        .arg("--image-opts")
        .arg(format!(
            "driver=raw,file.driver=nbd,file.server.type=inet,file.server.host=127.0.0.1,file.server.port={port},file.export={export},file.tls-creds=tls0"
        ));
    for cmd in cmds {
        c.arg("-c").arg(cmd);
    }
    let o = c.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    (
        o.status.success() && !text.contains("Pattern verification failed"),
        text,
    )
}

/// The export with TLS and client certificates: qemu-io, nbdinfo and
/// nbdcopy with the right certificate work; a client without one, or
/// without TLS, is refused. Members over TLS too: a RAID1 of two qemu-nbd
/// exports that require TLS and a client certificate.
#[test]
fn tls_export_and_tls_members() {
    need("qemu-nbd");
    need("nbdinfo");
    let w = World::new("tls");
    let p = pki(&w.dir);
    // Members: qemu-nbd with TLS (it asks for a client certificate by
    // default), reached with nbds://.
    let mut servers = Vec::new();
    let mut uris = Vec::new();
    for i in 0..2 {
        let f = w.sparse(&format!("q{i}.img"), 64 * MIB);
        let port = free_port();
        let c = Command::new("qemu-nbd")
            .args([
                "-f",
                "raw",
                "--persistent",
                "-x",
                "d",
                "-p",
                &port.to_string(),
            ])
            .arg("--object")
            .arg(format!(
                "tls-creds-x509,id=tls0,endpoint=server,dir={}",
                p.server.display()
            ))
            .args(["--tls-creds", "tls0"])
            .arg(&f)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        servers.push(Server(c));
        wait_for("qemu-nbd", 10, || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        uris.push(format!(
            "nbds://127.0.0.1:{port}/d?tls-certificates={}",
            p.client.display()
        ));
    }
    // Without a client certificate the member cannot be opened; the error
    // says where to look.
    let anon = uris[0].replace(p.client.to_str().unwrap(), p.anonymous.to_str().unwrap());
    let (code, _, err) = w.code(&["create", "t1", "--level", "1", &anon, &uris[1]]);
    assert_ne!(code, 0);
    assert!(err.contains("client certificate"), "{err}");
    // Without TLS: the server's refusal, and the fix.
    let plain = uris[0].replacen("nbds://", "nbd://", 1);
    let plain = &plain[..plain.find('?').unwrap()];
    let (code, _, err) = w.code(&["create", "t1", "--level", "1", plain, &uris[1]]);
    assert_ne!(code, 0);
    assert!(err.contains("requires TLS: use nbds://"), "{err}");

    w.ok(&["create", "t1", "--level", "1", &uris[0], &uris[1]]);
    let port = free_port();
    let out = w.ok(&[
        "start",
        "t1",
        "--nbd",
        &format!("tcp:127.0.0.1:{port}"),
        "--tls",
        p.server.to_str().unwrap(),
        "--tls-verify-peer",
    ]);
    assert!(out.contains("TLS with client certificates"), "{out}");
    let (ok, out) = qemu_io_tls(
        port,
        "t1",
        &p.client,
        &["write -P 0x5a 0 8M", "read -P 0x5a 0 8M"],
    );
    assert!(ok, "{out}");
    let info = Command::new("nbdinfo")
        .arg(format!(
            "nbds://127.0.0.1:{port}/t1?tls-certificates={}",
            p.client.display()
        ))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&info.stdout);
    assert!(info.status.success() && text.contains("with TLS"), "{text}");
    let copy = w.dir.join("copy.img");
    let o = Command::new("nbdcopy")
        .arg(format!(
            "nbds://127.0.0.1:{port}/t1?tls-certificates={}",
            p.client.display()
        ))
        .arg(&copy)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let head = std::fs::read(&copy).unwrap();
    assert!(head[..8 * MIB as usize].iter().all(|&b| b == 0x5a));
    // Refused: a client without a certificate, and one without TLS.
    let (ok, out) = qemu_io_tls(port, "t1", &p.anonymous, &["read 0 4k"]);
    assert!(!ok, "a client without a certificate read the array: {out}");
    let o = Command::new("nbdinfo")
        .arg(format!("nbd://127.0.0.1:{port}/t1"))
        .output()
        .unwrap();
    assert!(!o.status.success(), "a client without TLS was served");
    w.ok(&["stop", "t1"]);
    drop(servers);
}

/// Serving NBD on a network address without TLS is refused unless
/// --insecure says so.
#[test]
fn a_network_export_needs_tls_or_insecure() {
    let w = World::new("insecure");
    let m: Vec<PathBuf> = (0..2)
        .map(|i| w.sparse(&format!("m{i}.img"), 16 * MIB))
        .collect();
    w.ok(&[
        "create",
        "ins",
        "--level",
        "1",
        m[0].to_str().unwrap(),
        m[1].to_str().unwrap(),
    ]);
    let port = free_port();
    let spec = format!("tcp:0.0.0.0:{port}");
    let (code, _, err) = w.code(&["start", "ins", "--nbd", &spec]);
    assert_ne!(code, 0);
    assert!(
        err.contains("--tls DIR") && err.contains("--insecure"),
        "{err}"
    );
    assert_eq!(w.status_json("ins")["state"], "stopped");
    let (code, _, err) = w.code(&["start", "ins", "--nbd", &spec, "--tls-verify-peer"]);
    assert_ne!(code, 0, "{err}");
    let with_tls = |dir: &Path| {
        w.code(&[
            "start",
            "ins",
            "--nbd",
            &spec,
            "--tls",
            dir.to_str().unwrap(),
        ])
    };
    // A TLS folder without its files: not found (exit 3), the file named.
    let empty = w.dir.join("no-certs");
    std::fs::create_dir_all(&empty).unwrap();
    let (code, _, err) = with_tls(&empty);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("server-cert.pem: no such file"), "{err}");
    assert_eq!(w.status_json("ins")["state"], "stopped");
    // An expired server certificate: refused at start, its date said (it
    // started, and every client then failed its handshake).
    if let Some(expired) = expired_server_certificate(&w.dir.join("expired")) {
        let (code, _, err) = with_tls(&expired);
        assert_eq!(code, 2, "{err}");
        assert!(
            err.contains("expired on 2020-01-02 00:00 UTC") && err.contains("renew it"),
            "{err}"
        );
        assert_eq!(w.status_json("ins")["state"], "stopped");
    }
    let out = w.ok(&["start", "ins", "--nbd", &spec, "--insecure"]);
    assert!(out.contains(&format!("tcp:0.0.0.0:{port}")), "{out}");
    w.ok(&["stop", "ins"]);
}

/// Starts `name` with a TLS export on a free port, its connections served
/// on the shards (`on_shards` "1") or on threads of their own ("0"):
/// the port.
fn start_tls_export(w: &World, name: &str, p: &Pki, on_shards: &str) -> u16 {
    let port = free_port();
    let out = w.run_env(
        &[
            "start",
            name,
            "--nbd",
            &format!("tcp:127.0.0.1:{port}"),
            "--tls",
            p.server.to_str().unwrap(),
        ],
        &[("RAIDCTL_NBD_ON_SHARDS", on_shards)],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    port
}

/// The most threads named `nbd-replies` (one per connection served on
/// threads of its own) the daemon had while qemu-io held a TLS connection
/// open for a second and a half.
fn reply_threads_while_connected(w: &World, port: u16, p: &Pki) -> usize {
    let pid = w.daemon_pid();
    let count = || raid_e2e::threads_named(pid, "nbd-replies");
    std::thread::scope(|sc| {
        let client = sc.spawn(|| qemu_io_tls(port, "tc", &p.client, &["read 0 4k", "sleep 1500"]));
        let mut most = 0;
        while !client.is_finished() {
            most = most.max(count());
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let (ok, out) = client.join().unwrap();
        assert!(ok, "{out}");
        most
    })
}

/// A TLS connection with many requests in flight, served on a shard (the
/// default: no thread of its own) and on threads of its own
/// (`RAIDCTL_NBD_ON_SHARDS=0`): 24 MiB of random data copied in by
/// nbdcopy (its requests of 256 KiB, past what rustls holds of a
/// connection's records at once, four connections of 64 in flight) and
/// copied back out, byte for byte the same.
#[test]
fn random_data_in_and_out_over_tls_on_a_shard_and_on_threads() {
    need("nbdcopy");
    let w = World::new("tlscopy");
    let p = pki(&w.dir);
    let src = w.dir.join("random.img");
    let data: Vec<u8> = {
        use std::io::Read;
        let mut d = vec![0u8; 24 * MIB as usize];
        std::fs::File::open("/dev/urandom")
            .unwrap()
            .read_exact(&mut d)
            .unwrap();
        d
    };
    std::fs::write(&src, &data).unwrap();
    let _m = w.raid5_of_four("tc", 16 * MIB);
    for (served, env) in [("a shard", "1"), ("threads", "0")] {
        let port = start_tls_export(&w, "tc", &p, env);
        let uri = format!(
            "nbds://127.0.0.1:{port}/tc?tls-certificates={}",
            p.client.display()
        );
        let copy = |from: &str, to: &str| {
            run_ok(Command::new("nbdcopy").args(["--connections=4", "--requests=64", from, to]));
        };
        copy(src.to_str().unwrap(), &uri);
        let back = w.dir.join(format!("back-{env}.img"));
        copy(&uri, back.to_str().unwrap());
        let got = std::fs::read(&back).unwrap();
        assert!(
            got[..data.len()] == data[..],
            "the data read back over TLS (served on {served}) differs at byte {}",
            got.iter().zip(&data).position(|(a, b)| a != b).unwrap_or(0)
        );
        let threads = reply_threads_while_connected(&w, port, &p);
        match env {
            "1" => assert_eq!(threads, 0, "a TLS connection had threads of its own"),
            _ => assert!(threads >= 1, "a TLS connection had no thread of its own"),
        }
        w.ok(&["stop", "tc"]);
        // The next start's daemon reads the variable anew.
        w.end_daemon();
    }
}

/// A raw NBD client over TLS on `port`: fixed newstyle, STARTTLS, then
/// EXPORT_NAME `name` over TLS, trusting the authority in `ca_dir`.
fn tls_client(
    port: u16,
    name: &str,
    ca_dir: &Path,
) -> rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream> {
    use raid_e2e::nbd_client::{nbd_export_name, nbd_hello, option_reply};
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, ServerName};
    use std::io::Write;
    let mut t = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    t.set_read_timeout(Some(std::time::Duration::from_secs(20)))
        .unwrap();
    nbd_hello(&mut t);
    let mut opt = b"IHAVEOPT".to_vec();
    opt.extend_from_slice(&5u32.to_be_bytes()); // STARTTLS
    opt.extend_from_slice(&0u32.to_be_bytes());
    t.write_all(&opt).unwrap();
    assert_eq!(option_reply(&mut t).0, 1, "STARTTLS refused");
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca_dir.join("ca-cert.pem")).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let host = ServerName::try_from("127.0.0.1").unwrap();
    let conn = rustls::ClientConnection::new(std::sync::Arc::new(cfg), host).unwrap();
    let mut s = rustls::StreamOwned::new(conn, t);
    nbd_export_name(&mut s, name);
    s
}

/// A TLS client that sends 32 MiB of reads and its disconnect, then reads
/// the replies only a second later (the socket full meanwhile, records
/// waiting in rustls, replies waiting behind them), gets every one whole:
/// the connection ends once all are out, not at the disconnect, and with
/// the server's close_notify (on a shard and on threads).
#[test]
fn tls_replies_go_out_whole_after_the_client_disconnects() {
    use raid_e2e::nbd_client::{nbd_reply, nbd_request};
    use std::io::{Read, Write};
    let (n, sz) = (32u64, MIB);
    let w = World::new("tlsdisc");
    let p = pki(&w.dir);
    let _m = w.raid5_of_four("td", 16 * MIB);
    for (served, env) in [("a shard", "1"), ("threads", "0")] {
        let port = start_tls_export(&w, "td", &p, env);
        let mut s = tls_client(port, "td", &p.client);
        let mut out = Vec::new();
        for i in 0..n {
            nbd_request(&mut out, 0, 0, i, i * sz, sz as u32); // READ
        }
        nbd_request(&mut out, 2, 0, n, 0, 0); // DISC
        s.write_all(&out).unwrap();
        s.flush().unwrap();
        // Meanwhile the server fills the socket, and rustls's records
        // behind it.
        std::thread::sleep(std::time::Duration::from_secs(1));
        let mut seen = std::collections::HashSet::new();
        let mut data = vec![0u8; sz as usize];
        for k in 0..n {
            let (err, cookie) = nbd_reply(&mut s).unwrap_or_else(|| {
                panic!("{served}: reply {k} of {n} never came: the connection ended")
            });
            assert_eq!(err, 0, "{served}: read {cookie}");
            s.read_exact(&mut data)
                .unwrap_or_else(|e| panic!("{served}: reply {k} of {n} cut short: {e}"));
            assert!(
                seen.insert(cookie),
                "{served}: cookie {cookie} answered twice"
            );
        }
        // Then the server ends TLS as TLS ends: its close_notify, so that
        // the client can tell the end of the stream from a connection cut
        // short.
        let mut rest = [0u8; 1];
        match s.read(&mut rest) {
            Ok(0) => {}
            other => panic!("{served}: the stream did not end with close_notify: {other:?}"),
        }
        drop(s);
        w.ok(&["stop", "td"]);
        // The next start's daemon reads the variable anew.
        w.end_daemon();
    }
}
