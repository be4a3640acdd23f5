//! The GPU parity engine through the real binary: an array created with
//! `--parity gpu` serves NBD with its parity from the GPU (lavapipe in CI),
//! scrubs clean, and rebuilds a failed member from GPU-recovered data; the
//! same array started where no GPU is visible runs on the CPU and logs the
//! fallback event; `--parity` on start changes the recorded choice.

use raid_e2e::{qemu_io, World};

fn events(w: &World, name: &str) -> Vec<String> {
    let ev: serde_json::Value =
        serde_json::from_str(&w.ok(&["events", name, "--format", "json"])).unwrap();
    ev.as_array()
        .unwrap()
        .iter()
        .map(|e| e["event"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn an_array_on_the_gpu_engine_serves_scrubs_rebuilds_and_falls_back() {
    let w = World::new("gpu");
    let m: Vec<String> = (0..5)
        .map(|i| {
            w.sparse(&format!("m{i}.img"), 96 << 20)
                .display()
                .to_string()
        })
        .collect();
    let spare = w.sparse("spare.img", 96 << 20).display().to_string();
    let mut args = vec!["create", "g", "--level", "6", "--parity", "gpu"];
    args.extend(m.iter().map(|s| s.as_str()));
    let out = w.ok(&args);
    assert!(out.contains("parity engine gpu"), "{out}");

    let sock = w.dir.join("g.sock");
    let nbd = format!("unix:{}", sock.display());
    w.ok(&["start", "g", "--nbd", &nbd]);
    let st = w.status_json("g");
    let Some(adapter) = st["gpu_adapter"].as_str() else {
        if std::env::var("RAID_GPU_TESTS").is_ok_and(|v| v == "skip") {
            eprintln!("RAID_GPU_TESTS=skip and no adapter: {st}");
            return;
        }
        panic!("no GPU adapter opened (install mesa-vulkan-drivers): {st}");
    };
    assert!(!adapter.is_empty());
    assert_eq!(st["parity_mode"], "gpu");
    assert!(
        st["parity_engine"].as_str().unwrap().starts_with("gpu/"),
        "{st}"
    );
    let text = w.ok(&["status", "g"]);
    assert!(text.contains("parity: mode gpu; gpu adapter"), "{text}");

    // Full stripes (3 data chunks of 64 KiB = 192 KiB each) and partial ones.
    let (ok, text) = qemu_io(
        &sock,
        "g",
        &[
            "write -P 0x5a 0 12M",
            "write -P 0x17 4k 100k",
            "write -P 0x21 20M 8M",
            "flush",
            "read -P 0x5a 0 4k",
            "read -P 0x17 4k 100k",
            "read -P 0x5a 104k 11M",
            "read -P 0x21 20M 8M",
        ],
    );
    assert!(ok, "{text}");
    let st = w.status_json("g");
    assert!(st["parity_calls_gpu"].as_u64().unwrap() > 0, "{st}");
    assert_eq!(st["parity_calls_cpu"].as_u64().unwrap(), 0, "{st}");

    let out = w.ok(&["scrub", "g"]);
    assert!(out.contains(" 0 mismatches"), "{out}");

    // A member dies; the rebuild onto the spare recovers it on the GPU.
    w.ok(&["fail", "g", &m[1]]);
    w.ok(&["replace", "g", &m[1], &spare]);
    w.ok(&["wait", "g"]);
    assert_eq!(w.status_json("g")["state"], "optimal");
    let out = w.ok(&["scrub", "g"]);
    assert!(out.contains(" 0 mismatches"), "{out}");
    let (ok, text) = qemu_io(
        &sock,
        "g",
        &[
            "read -P 0x5a 0 4k",
            "read -P 0x17 4k 100k",
            "read -P 0x21 20M 8M",
        ],
    );
    assert!(ok, "{text}");
    assert!(!events(&w, "g").contains(&"parity_engine_fallback".to_string()));
    w.ok(&["stop", "g"]);

    // The members moved to a host where no GPU is visible (a new daemon
    // with RAID_GPU=off): the array still starts in gpu mode, runs on the
    // CPU, says why, and logs the fallback.
    let w2 = World::new("gpu-off");
    let sock2 = w2.dir.join("g.sock");
    let nbd2 = format!("unix:{}", sock2.display());
    let mut args = vec![
        "start",
        "g",
        "--parity",
        "gpu",
        "--nbd",
        &nbd2,
        "--members",
        &m[0],
        &spare,
    ];
    args.extend(m[2..].iter().map(|s| s.as_str()));
    let o = w2.run_env(&args, &[("RAID_GPU", "off")]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let st = w2.status_json("g");
    assert!(
        st["parity_engine"].as_str().unwrap().starts_with("cpu/"),
        "{st}"
    );
    assert!(
        st["parity_note"].as_str().unwrap().contains("RAID_GPU=off"),
        "{st}"
    );
    let (ok, text) = qemu_io(
        &sock2,
        "g",
        &[
            "read -P 0x21 20M 8M",
            "write -P 0x33 0 1M",
            "read -P 0x33 0 1M",
        ],
    );
    assert!(ok, "{text}");
    // In the log by the time the start command answered.
    let evs = events(&w2, "g");
    assert!(
        evs.contains(&"parity_engine_fallback".to_string()),
        "{evs:?}"
    );
    assert!(evs.contains(&"parity_engine_chosen".to_string()), "{evs:?}");
    w2.ok(&["stop", "g"]);

    // --parity on start changes the recorded choice.
    w.ok(&["start", "g", "--parity", "cpu"]);
    let st = w.status_json("g");
    assert_eq!(st["parity_mode"], "cpu");
    assert!(st["gpu_adapter"].is_null(), "{st}");
    w.ok(&["stop", "g"]);
    let st = w.status_json("g");
    assert_eq!(st["parity_mode"], "cpu", "recorded: {st}");
    let o = w.run(&["start", "g", "--parity", "fpga"]);
    assert_eq!(o.status.code(), Some(2));
}
