//! What an operator watches, tested with the tools that read it: the
//! metrics endpoint checked by `promtool` and scraped by a real Prometheus
//! server (Debian's `prometheus` package), `iostat` against I/O made by
//! qemu-io, and drive-health warnings that arrive as events and alerts.

use raid_e2e::{free_port, make_executable, qemu_io, World};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

/// GET http://127.0.0.1:PORT/PATH; (status code, body).
fn http_get(port: u16, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    // Chunked bodies (Prometheus's API) are joined back.
    let chunked = text.split_once("\r\n\r\n").is_some_and(|(h, _)| {
        h.to_ascii_lowercase()
            .contains("transfer-encoding: chunked")
    });
    Ok((code, if chunked { dechunk(&body) } else { body }))
}

fn dechunk(mut b: &str) -> String {
    let mut out = String::new();
    while let Some((len, rest)) = b.split_once("\r\n") {
        let n = usize::from_str_radix(len.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        b = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// The value of the sample with exactly this name and these labels.
fn sample(metrics: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut want: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
    want.sort();
    metrics.lines().find_map(|l| {
        let (series, value) = l.rsplit_once(' ')?;
        let (n, rest) = series.split_once('{').unwrap_or((series, ""));
        let mut have: Vec<String> = rest
            .trim_end_matches('}')
            .split(',')
            .filter(|x| !x.is_empty())
            .map(String::from)
            .collect();
        have.sort();
        (n == name && have == want).then(|| value.parse().ok())?
    })
}

/// A RAID5 of three 32 MiB files, started with an NBD socket.
fn raid5(w: &World, name: &str, env: &[(&str, &str)]) -> (Vec<PathBuf>, PathBuf) {
    let m: Vec<PathBuf> = (0..3)
        .map(|i| w.sparse(&format!("{name}{i}.img"), 32 * MIB))
        .collect();
    let p: Vec<&str> = m.iter().map(|p| p.to_str().unwrap()).collect();
    w.ok(&["create", name, "--level", "5", p[0], p[1], p[2]]);
    let sock = w.dir.join(format!("{name}.sock"));
    let spec = format!("unix:{}", sock.display());
    let o = w.run_env(&["start", name, "--nbd", &spec], env);
    assert!(
        o.status.success(),
        "start: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    (m, sock)
}

fn write_config(w: &World, text: &str) {
    std::fs::create_dir_all(w.state()).unwrap();
    std::fs::write(w.state().join("raidctl.toml"), text).unwrap();
}

fn promtool_check(metrics: &str) {
    let mut c = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian package prometheus; scripts/install-test-deps.sh)");
    c.stdin
        .take()
        .unwrap()
        .write_all(metrics.as_bytes())
        .unwrap();
    let o = c.wait_with_output().unwrap();
    assert!(
        o.status.success(),
        "promtool check metrics failed:\n{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// A Prometheus server scraping the daemon every second, stopped on drop.
struct Prometheus {
    child: std::process::Child,
    port: u16,
}

impl Prometheus {
    fn start(dir: &Path, target: u16) -> Prometheus {
        let port = free_port();
        let cfg = dir.join("prometheus.yml");
        std::fs::write(
            &cfg,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n\
                 scrape_configs:\n  - job_name: raidctl\n    static_configs:\n      - targets: ['127.0.0.1:{target}']\n"
            ),
        )
        .unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", cfg.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("prometheus.log")).unwrap())
            .spawn()
            .expect("prometheus (Debian package prometheus; scripts/install-test-deps.sh)");
        Prometheus { child, port }
    }

    /// The value of an instant query, once it has one (within `secs`).
    fn wait_value(&self, query: &str, want: f64, secs: u64) -> f64 {
        let t = Instant::now();
        let q: String = query
            .bytes()
            .map(|b| match b {
                b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' => (b as char).to_string(),
                _ => format!("%{b:02X}"),
            })
            .collect();
        let mut last = String::new();
        while t.elapsed() < Duration::from_secs(secs) {
            if let Ok((200, body)) = http_get(self.port, &format!("/api/v1/query?query={q}")) {
                let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
                if let Some(x) = v["data"]["result"][0]["value"][1]
                    .as_str()
                    .and_then(|s| s.parse::<f64>().ok())
                {
                    if x == want {
                        return x;
                    }
                }
                last = body;
            }
            std::thread::sleep(Duration::from_millis(300));
        }
        panic!("Prometheus never saw {query} = {want}; last answer: {last}");
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn metrics_pass_promtool_and_a_prometheus_server_reads_them() {
    let w = World::new("metrics");
    let port = free_port();
    write_config(&w, &format!("[metrics]\nlisten = \"127.0.0.1:{port}\"\n"));
    let (m, sock) = raid5(&w, "mx", &[]);
    // 4 MiB as 128 writes of 32 KiB: latency is timed on one request in
    // eight, so a handful of requests might go untimed.
    let mut cmds: Vec<String> = (0..128)
        .map(|i| format!("write -P 9 {} 32k", i * 32 * 1024))
        .collect();
    cmds.push("flush".into());
    cmds.push("read -P 9 0 4M".into());
    let cmds: Vec<&str> = cmds.iter().map(String::as_str).collect();
    let (ok, out) = qemu_io(&sock, "mx", &cmds);
    assert!(ok, "{out}");

    let (code, text) = http_get(port, "/metrics").expect("the daemon serves metrics");
    assert_eq!(code, 200, "{text}");
    promtool_check(&text);
    let get = |name: &str, labels: &[(&str, &str)]| {
        sample(&text, name, labels).unwrap_or_else(|| panic!("no {name}{labels:?} in\n{text}"))
    };
    assert_eq!(get("raidctl_arrays", &[]), 1.0);
    assert_eq!(
        get(
            "raidctl_array_state",
            &[("array", "mx"), ("state", "optimal")]
        ),
        1.0
    );
    assert_eq!(
        get(
            "raidctl_array_bytes_total",
            &[("array", "mx"), ("op", "write")]
        ),
        (4 * MIB) as f64
    );
    assert!(
        get(
            "raidctl_array_bytes_total",
            &[("array", "mx"), ("op", "read")]
        ) >= (4 * MIB) as f64
    );
    assert!(
        get(
            "raidctl_array_operations_total",
            &[("array", "mx"), ("op", "flush")]
        ) >= 1.0
    );
    // RAID5 of 3: every 4 MiB of data writes 2 MiB of parity, all on members.
    let member_writes: f64 = (0..3)
        .map(|i| {
            get(
                "raidctl_member_bytes_total",
                &[
                    ("array", "mx"),
                    ("slot", &i.to_string()),
                    ("member", m[i].to_str().unwrap()),
                    ("op", "write"),
                ],
            )
        })
        .sum();
    assert!(
        member_writes >= (6 * MIB) as f64,
        "members wrote {member_writes} bytes for 4 MiB of data"
    );
    assert!(
        get(
            "raidctl_array_latency_seconds_count",
            &[("array", "mx"), ("op", "write")]
        ) >= 1.0
    );
    assert_eq!(
        get("raidctl_array_parity_fallbacks_total", &[("array", "mx")]),
        0.0
    );
    // Just written: the regions are still marked (they linger 5 s).
    assert!(get("raidctl_array_bitmap_dirty_regions", &[("array", "mx")]) >= 1.0);
    // The NBD export's engine: each of the 128 writes served once, on a
    // shard, in the reader's thread (members in memory) or on the blocking
    // threads, or merged into another; the reads too; nothing on shards
    // where there are none.
    let engine = |op: &str, path: &str| {
        get(
            "raidctl_engine_requests_total",
            &[("array", "mx"), ("op", op), ("path", path)],
        )
    };
    let merged = get("raidctl_engine_writes_merged_total", &[("array", "mx")]);
    let split = get("raidctl_engine_writes_split_total", &[("array", "mx")]);
    let writes = engine("write", "shard") + engine("write", "inline") + engine("write", "blocking");
    assert_eq!(writes + merged - split, 128.0);
    let reads = engine("read", "shard") + engine("read", "inline") + engine("read", "blocking");
    assert!(reads >= 1.0);
    let shards = get("raidctl_engine_shards", &[("array", "mx")]);
    assert!(shards >= 1.0 || engine("read", "shard") + engine("write", "shard") == 0.0);
    // Local members: the blocking threads stay at what they started with
    // (16 beside shards, 64 or more without).
    let blocking = get("raidctl_engine_blocking_threads", &[("array", "mx")]);
    assert!(
        blocking == 16.0 || blocking >= 64.0,
        "{blocking} blocking threads"
    );
    assert!(http_get(port, "/nothing").unwrap().0 == 404);

    // A real server scrapes the daemon; a member fails; it sees it.
    let prom = Prometheus::start(&w.dir, port);
    prom.wait_value("raidctl_array_degraded_slots{array=\"mx\"}", 0.0, 60);
    w.ok(&["fail", "mx", m[1].to_str().unwrap()]);
    prom.wait_value("raidctl_array_degraded_slots{array=\"mx\"}", 1.0, 30);
    prom.wait_value(
        "raidctl_array_state{array=\"mx\",state=\"degraded\"}",
        1.0,
        30,
    );
    prom.wait_value(
        "raidctl_array_events_total{array=\"mx\",kind=\"member_failed\"}",
        1.0,
        30,
    );
    prom.wait_value(
        &format!(
            "raidctl_member_state{{array=\"mx\",slot=\"1\",state=\"failed\",member=\"{}\"}}",
            m[1].display()
        ),
        1.0,
        30,
    );
    // Replaced and rebuilt slowly: the slot's own progress is a series.
    w.ok(&["rate", "mx", "--rebuild", "1M"]);
    let new = w.sparse("mx-new1.img", 64 * MIB);
    w.ok(&[
        "replace",
        "mx",
        m[1].to_str().unwrap(),
        new.to_str().unwrap(),
    ]);
    let (_, text) = http_get(port, "/metrics").unwrap();
    let done = sample(
        &text,
        "raidctl_member_rebuild_progress_ratio",
        &[
            ("array", "mx"),
            ("slot", "1"),
            ("member", new.to_str().unwrap()),
        ],
    )
    .unwrap_or_else(|| panic!("no slot progress while rebuilding:\n{text}"));
    assert!((0.0..=1.0).contains(&done), "{done}");
    promtool_check(&text);
    w.ok(&["rate", "mx", "--rebuild", "0"]);
    w.ok(&["wait", "mx"]);
    let (_, text) = http_get(port, "/metrics").unwrap();
    assert!(
        !text.contains("raidctl_member_rebuild_progress_ratio{"),
        "a slot's progress with no rebuild:\n{text}"
    );
}

#[test]
fn a_metrics_port_in_use_fails_the_start_clearly() {
    let w = World::new("metrics-busy");
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = busy.local_addr().unwrap().port();
    let o = Command::new(raid_e2e::raidctl_path())
        .env("RAIDCTL_STATE_DIR", w.state())
        .args(["daemon", "--metrics", &format!("127.0.0.1:{port}")])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("cannot serve metrics on 127.0.0.1:{port}")),
        "{err}"
    );
    let o = Command::new(raid_e2e::raidctl_path())
        .env("RAIDCTL_STATE_DIR", w.state())
        .args(["daemon", "--metrics", "localhost"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("'localhost' is not HOST:PORT"), "{err}");
    assert_ne!(o.status.code(), Some(0));
}

#[test]
fn iostat_reports_the_io_made_during_its_interval() {
    let w = World::new("iostat");
    let (m, sock) = raid5(&w, "io", &[]);
    let state = w.state();
    // Two reports 2 s apart; the writes land in the first.
    let ios = std::thread::spawn(move || {
        Command::new(raid_e2e::raidctl_path())
            .env("RAIDCTL_STATE_DIR", state)
            .args(["iostat", "io", "2", "4", "--format", "json"])
            .output()
            .unwrap()
    });
    std::thread::sleep(Duration::from_millis(500));
    // 8 MiB as 256 writes of 32 KiB (latency is timed on one in eight).
    let cmds: Vec<String> = (0..256)
        .map(|i| format!("write -P 3 {} 32k", i * 32 * 1024))
        .collect();
    let cmds: Vec<&str> = cmds.iter().map(String::as_str).collect();
    let (ok, out) = qemu_io(&sock, "io", &cmds);
    assert!(ok, "{out}");
    let o = ios.join().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 4, "{lines:?}");
    // Four consecutive 2 s reports: together they saw every byte written
    // (however the writes fell across them), each member wrote, and the
    // writes were timed.
    let mut written = 0.0;
    let mut timed = false;
    for r in &lines {
        let secs = r["interval_seconds"].as_f64().unwrap();
        assert!((1.9..3.5).contains(&secs), "interval {secs}");
        let a = &r["arrays"][0];
        assert_eq!(a["name"], "io");
        assert_eq!(a["members"].as_array().unwrap().len(), 3);
        assert_eq!(a["members"][2]["member"], m[2].to_str().unwrap());
        written += a["write"]["bytes_per_second"].as_f64().unwrap() * secs;
        timed |= a["write"]["await_ms"].as_f64().is_some_and(|ms| ms > 0.0);
    }
    assert!(
        (written - (8 * MIB) as f64).abs() < 16.0,
        "iostat saw {written} bytes written, qemu-io wrote 8 MiB"
    );
    assert!(timed, "no write latency in {lines:?}");
    let busiest = lines
        .iter()
        .max_by(|a, b| {
            let w = |r: &serde_json::Value| r["arrays"][0]["write"]["per_second"].as_f64().unwrap();
            w(a).total_cmp(&w(b))
        })
        .unwrap();
    for k in 0..3 {
        assert!(
            busiest["arrays"][0]["members"][k]["write"]["per_second"]
                .as_f64()
                .unwrap()
                > 0.0
        );
    }
    // The text form has its header and a line per member.
    let text = w.ok(&["iostat", "io", "0.2", "1"]);
    assert!(text.starts_with("device"), "{text}");
    assert_eq!(
        text.lines().filter(|l| !l.is_empty()).count(),
        1 + 1 + 3,
        "{text}"
    );
    // A stopped array is an error naming the fix.
    w.ok(&["stop", "io"]);
    let (code, _, err) = w.code(&["iostat", "io"]);
    assert_ne!(code, 0);
    assert!(err.contains("raidctl start io"), "{err}");
}

/// A stand-in for smartctl that prints a recorded real output (a drive
/// with media errors), with smartctl's exit status for it.
fn fake_smartctl(w: &World, sample: &str, status: i32) -> PathBuf {
    let data = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../raidctl/tests/data/health")
        .join(sample);
    let p = w.dir.join("smartctl");
    std::fs::write(
        &p,
        format!("#!/bin/sh\ncat '{}'\nexit {status}\n", data.display()),
    )
    .unwrap();
    make_executable(&p);
    p
}

#[test]
fn a_drive_health_warning_is_an_event_an_alert_and_a_metric() {
    let w = World::new("health");
    let smartctl = fake_smartctl(&w, "smartctl-nvme-media-errors.json", 64);
    let hook_out = w.dir.join("hook.log");
    let hook = w.dir.join("hook.sh");
    std::fs::write(
        &hook,
        format!(
            "#!/bin/sh\necho \"$RAIDCTL_EVENT $RAIDCTL_SEVERITY\" >> '{}'\n",
            hook_out.display()
        ),
    )
    .unwrap();
    make_executable(&hook);
    let port = free_port();
    // Alerts go to an unreachable mail server (queued) and the hook.
    write_config(
        &w,
        &format!(
            "[metrics]\nlisten = \"127.0.0.1:{port}\"\n[alerts]\nsmtp_host = \"127.0.0.1\"\nsmtp_port = 9\nsecurity = \"plain\"\nfrom = \"r@localhost\"\nto = [\"ops@example.com\"]\nhook = \"{}\"\n",
            hook.display()
        ),
    );
    let env = [
        ("RAIDCTL_SMARTCTL", smartctl.to_str().unwrap()),
        ("RAIDCTL_HEALTH_FILES", "1"),
    ];
    let _ = raid5(&w, "hx", &env);
    // The first reading comes within a second or so of the start.
    let t = Instant::now();
    let events = loop {
        let e = w.ok(&["events", "hx"]);
        if e.contains("member_health_warning") || t.elapsed() > Duration::from_secs(20) {
            break e;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    // One warning per member (three files, one recorded drive), not more.
    assert_eq!(
        events.matches("member_health_warning").count(),
        3,
        "{events}"
    );
    assert!(events.contains("media"), "{events}");
    let detail = w.ok(&["detail", "hx"]);
    assert!(detail.contains("Samsung SSD 970 EVO"), "{detail}");
    assert!(detail.contains("WARNING"), "{detail}");
    let st = w.status_json("hx");
    let h = &st["members"][0]["health"];
    assert_eq!(h["kind"], "nvme", "{st}");
    assert!(h["media_errors"].as_u64().unwrap() > 0, "{st}");
    assert!(!h["warnings"].as_array().unwrap().is_empty());
    // The hook ran as for any warning; the mail is queued.
    let t = Instant::now();
    while std::fs::read_to_string(&hook_out)
        .unwrap_or_default()
        .matches("member_health_warning warning")
        .count()
        < 3
        && t.elapsed() < Duration::from_secs(10)
    {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        std::fs::read_to_string(&hook_out)
            .unwrap_or_default()
            .matches("member_health_warning warning")
            .count(),
        3
    );
    let (_, text) = http_get(port, "/metrics").unwrap();
    promtool_check(&text);
    assert!(
        text.contains("raidctl_member_health_warnings{array=\"hx\",slot=\"0\""),
        "{text}"
    );
    assert!(
        text.contains("raidctl_member_media_errors_total{"),
        "{text}"
    );
    // The array itself is untouched: a warning fails nothing.
    assert_eq!(st["state"], "optimal");
}

#[test]
fn nvme_health_where_a_drive_exists() {
    let Some(dev) = (0..8)
        .map(|i| PathBuf::from(format!("/dev/nvme{i}n1")))
        .find(|p| p.exists())
    else {
        eprintln!("skipped: no NVMe device on this machine (/dev/nvme*n1)");
        return;
    };
    let have = |t: &str| Command::new(t).arg("--version").output().is_ok();
    if !have("nvme") && !have("smartctl") {
        eprintln!("skipped: neither nvme-cli nor smartmontools is installed");
        return;
    }
    let o = Command::new(raid_e2e::raidctl_path())
        .args(["health", dev.to_str().unwrap(), "--format", "json"])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v[0]["health"]["kind"], "nvme", "{v}");
    assert!(v[0]["health"]["model"].is_string(), "{v}");
    assert!(v[0]["health"]["percentage_used"].is_u64(), "{v}");
}

/// A daemon serving only metrics on a free port, answering by now.
fn metrics_daemon(w: &World) -> (std::process::Child, u16) {
    std::fs::create_dir_all(w.state()).unwrap();
    let port = free_port();
    let daemon = Command::new(raid_e2e::raidctl_path())
        .env("RAIDCTL_STATE_DIR", w.state())
        .args(["daemon", "--metrics", &format!("127.0.0.1:{port}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while http_get(port, "/metrics").is_err() && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(100));
    }
    (daemon, port)
}

#[test]
fn a_stalled_or_hostile_client_cannot_stop_the_metrics() {
    let w = World::new("metrics-hostile");
    let (mut daemon, port) = metrics_daemon(&w);
    // One announces a body it never sends, one sends half a request head
    // and stalls, one sends a head larger than any real one.
    let mut body = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        body,
        "POST /metrics HTTP/1.1\r\nContent-Length: 1000000\r\n\r\n"
    )
    .unwrap();
    let mut stall = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(stall, "GET /metr").unwrap();
    let mut huge = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let _ = huge.write_all(&vec![b'a'; 64 << 10]);
    // A scrape still gets its answer, while the stalled one waits still
    // (each connection has a thread: none waits out another's timeout).
    let (code, text) = http_get(port, "/metrics").unwrap();
    assert_eq!(code, 200);
    assert!(text.contains("raidctl_arrays 0"), "{text}");
    stall.set_nonblocking(true).unwrap();
    match stall.read(&mut [0u8; 1]) {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        r => panic!("the scrape was answered only after the stalled client was let go: {r:?}"),
    }
    promtool_check(&text);
    let mut answer = String::new();
    let _ = body.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 405"), "{answer}");
    // And the daemon still stops at once on SIGTERM.
    unsafe { libc::kill(daemon.id() as i32, libc::SIGTERM) };
    let t = Instant::now();
    loop {
        if let Some(s) = daemon.try_wait().unwrap() {
            assert!(s.success());
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "the daemon did not stop"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    drop((stall, huge));
}

/// Clients that open connections and send no request head, or dribble
/// one, cannot keep the scrapes out: a connection has a few seconds in all
/// for its head, however slowly it sends, and one that waits for its head
/// gives its place to a newcomer once every place is taken.
#[test]
fn connections_held_open_cannot_keep_the_scrapes_out() {
    let w = World::new("metrics-held");
    let (mut daemon, port) = metrics_daemon(&w);
    // More connections than the endpoint serves at once, each with half a
    // request head.
    let held: Vec<std::net::TcpStream> = (0..24)
        .map(|_| {
            let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
            write!(c, "GET /metr").unwrap();
            c
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let (code, text) = http_get(port, "/metrics").unwrap();
    assert_eq!(
        code,
        200,
        "a scrape behind {} stalled connections: {text}",
        held.len()
    );
    // One that sends a byte of its head every 300 ms is let go within the
    // head's time (5 s), not served for ever.
    let mut drip = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    drip.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let t = Instant::now();
    let closed_after = loop {
        let sent = drip.write_all(b"a");
        let mut b = [0u8; 64];
        let closed = match drip.read(&mut b) {
            Ok(_) => true,
            Err(e) => !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
        };
        if sent.is_err() || closed {
            break t.elapsed();
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "a client sending its request head a byte at a time was kept for 30 s"
        );
    };
    assert!(closed_after >= Duration::from_secs(3), "{closed_after:?}");
    drop(held);
    unsafe { libc::kill(daemon.id() as i32, libc::SIGTERM) };
    assert!(daemon.wait().unwrap().success());
}

/// `status` shows the write-intent bitmap's marked regions, and the daemon
/// clears them by itself once no write has come for their linger, with no
/// flush from the client after the writes (`[bitmap] linger_seconds`, 1 s
/// here).
#[test]
fn status_shows_the_bitmap_and_the_daemon_clears_it_once_idle() {
    let w = World::new("bmidle");
    std::fs::create_dir_all(w.state()).unwrap();
    std::fs::write(
        w.state().join("raidctl.toml"),
        "[bitmap]\nlinger_seconds = 1\n",
    )
    .unwrap();
    let m = w.sparse_members("m", 4, 32 * MIB);
    w.create("bm", "5", &m, &["--chunk", "16K"]);
    let sock = w.dir.join("bm.sock");
    w.ok(&["start", "bm", "--nbd", &format!("unix:{}", sock.display())]);
    let j = w.status_json("bm");
    let regions = j["bitmap_regions"].as_u64().expect("bitmap_regions");
    assert!(regions > 1, "{j}");
    // Written, and nothing after: whatever flush qemu-io's exit sends comes
    // within the linger, so the clear after it is the daemon's own.
    let (ok, out) = qemu_io(
        &sock,
        "bm",
        &["write -P 0x11 0 64k", "write -P 0x22 40M 64k"],
    );
    assert!(ok, "{out}");
    let dirty = w.status_json("bm")["bitmap_dirty_regions"]
        .as_u64()
        .unwrap();
    assert!(dirty >= 2, "{dirty} regions marked after writes into two");
    let text = w.ok(&["status", "bm"]);
    assert!(
        text.contains(&format!("{dirty} of {regions} regions marked")),
        "{text}"
    );
    let t = Instant::now();
    while w.status_json("bm")["bitmap_dirty_regions"].as_u64() != Some(0) {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the bits were not cleared: {}",
            w.status_json("bm")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        t.elapsed() >= Duration::from_millis(500),
        "cleared before their linger"
    );
    let text = w.ok(&["status", "bm"]);
    assert!(!text.contains("write-intent bitmap"), "{text}");
    let (ok, out) = qemu_io(&sock, "bm", &["read -P 0x11 0 64k", "read -P 0x22 40M 64k"]);
    assert!(ok, "{out}");
    w.ok(&["stop", "bm"]);
}
