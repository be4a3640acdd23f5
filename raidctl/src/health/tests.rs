//! The parsers against real tool outputs (tests/data/health, sources in
//! SOURCES.md there), and each warning rule.

use super::*;

fn smartctl(text: &str) -> DriveHealth {
    parse_smartctl_json(text).expect("sample parses")
}

fn o<T: std::fmt::Display>(v: &Option<T>) -> String {
    v.as_ref().map_or("-".to_string(), |v| v.to_string())
}

/// "kind model / serial / firmware", "-" where absent.
fn ident(h: &DriveHealth) -> String {
    let (m, s, f) = (o(&h.model), o(&h.serial), o(&h.firmware));
    format!("{} {m} / {s} / {f}", h.kind)
}

/// Every health figure on one line, "-" where absent.
fn figures(h: &DriveHealth) -> String {
    format!(
        "cw={} spare={}/{} used={} media={} temp={} passed={} \
         realloc={} pending={} offline={} grown={}",
        o(&h.critical_warning),
        o(&h.available_spare_percent),
        o(&h.available_spare_threshold_percent),
        o(&h.percentage_used),
        o(&h.media_errors),
        o(&h.temperature_celsius),
        o(&h.smart_passed),
        o(&h.reallocated_sectors),
        o(&h.pending_sectors),
        o(&h.offline_uncorrectable),
        o(&h.grown_defects),
    )
}

fn judged(h: &DriveHealth) -> Vec<String> {
    warnings(h, &HealthThresholds::default())
}

fn has(w: &[String], needle: &str) -> bool {
    w.iter().any(|s| s.contains(needle))
}

#[test]
fn smartctl_nvme_samples() {
    let h = smartctl(include_str!(
        "../../tests/data/health/smartctl-nvme-healthy.json"
    ));
    assert_eq!(
        ident(&h),
        "nvme INTEL SSDPEKNW010T8 / BTNH93710FS91P0B / 002C"
    );
    let want = "cw=0 spare=100/10 used=0 media=0 temp=36 passed=true \
                realloc=- pending=- offline=- grown=-";
    assert_eq!(figures(&h), want);
    assert!(judged(&h).is_empty(), "{:?}", judged(&h));

    let h = smartctl(include_str!(
        "../../tests/data/health/smartctl-nvme-media-errors.json"
    ));
    assert_eq!(
        ident(&h),
        "nvme Samsung SSD 970 EVO 500GB / S466NX0M776250H / 2B2QEXE7"
    );
    let want = "cw=0 spare=99/10 used=3 media=7 temp=35 passed=true \
                realloc=- pending=- offline=- grown=-";
    assert_eq!(figures(&h), want);
    let w = judged(&h);
    assert!(
        w.len() == 1 && has(&w, "7 media and data integrity errors"),
        "{w:?}"
    );

    // Exit status 8 (bit 3, "disk failing") still comes with valid data.
    let h = smartctl(include_str!(
        "../../tests/data/health/smartctl-nvme-critical-warning.json"
    ));
    assert_eq!(
        ident(&h),
        "nvme SAMSUNG MZWLL3T2HAJQ-00005 / REDACTED / REDACTED"
    );
    let want = "cw=16 spare=100/10 used=0 media=0 temp=40 passed=false \
                realloc=- pending=- offline=- grown=-";
    assert_eq!(figures(&h), want);
    let w = judged(&h);
    assert_eq!(w.len(), 2, "{w:?}");
    assert!(
        has(&w, "bit 4: the volatile memory backup device has failed"),
        "{w:?}"
    );
    assert!(has(&w, "says FAILED"), "{w:?}");

    let h = smartctl(include_str!(
        "../../tests/data/health/smartctl-nvme-worn.json"
    ));
    assert_eq!(ident(&h), "nvme INTEL SSDPE2KX020T7 / REDACTED / REDACTED");
    let want = "cw=0 spare=99/10 used=75 media=0 temp=19 passed=true \
                realloc=- pending=- offline=- grown=-";
    assert_eq!(figures(&h), want);
    assert!(judged(&h).is_empty(), "75% is below the default of 90%");
    let strict = HealthThresholds {
        percentage_used: 75,
        ..HealthThresholds::default()
    };
    let w = warnings(&h, &strict);
    assert!(w.len() == 1 && has(&w, "endurance used is 75%"), "{w:?}");
}

#[test]
fn smartctl_ata_samples() {
    let h = smartctl(include_str!(
        "../../tests/data/health/smartctl-ata-healthy.json"
    ));
    assert_eq!(ident(&h), "ata WDC WD140EDFZ-11A0VA0 / 9RK1XXXX / 81.00A81");
    let want = "cw=- spare=-/- used=- media=- temp=32 passed=true \
                realloc=0 pending=0 offline=0 grown=-";
    assert_eq!(figures(&h), want);
    assert!(judged(&h).is_empty(), "{:?}", judged(&h));

    // Exit status 216: failing-disk, prefail and error-log bits, valid data.
    let h = smartctl(include_str!(
        "../../tests/data/health/smartctl-ata-failing.json"
    ));
    assert_eq!(
        ident(&h),
        "ata Hitachi HDS721050DLE630 / MSK423Y20S3HBC / MS1OA650"
    );
    let want = "cw=- spare=-/- used=- media=- temp=25 passed=false \
                realloc=1975 pending=8 offline=0 grown=-";
    assert_eq!(figures(&h), want);
    let w = judged(&h);
    assert_eq!(w.len(), 3, "{w:?}");
    assert!(
        has(&w, "says FAILED") && has(&w, "1975 reallocated sectors"),
        "{w:?}"
    );
    assert!(has(&w, "8 sectors pending reallocation"), "{w:?}");
}

#[test]
fn smartctl_scsi_samples() {
    // smartctl 6.7 names the drive "model_name" and "revision".
    let h = smartctl(include_str!(
        "../../tests/data/health/smartctl-scsi-healthy.json"
    ));
    assert_eq!(
        ident(&h),
        "scsi SEAGATE ST1200MM0088 / Z4028VRY0000C810BZXB / N004"
    );
    let want = "cw=- spare=-/- used=- media=- temp=31 passed=true \
                realloc=- pending=- offline=- grown=0";
    assert_eq!(figures(&h), want);
    assert!(judged(&h).is_empty(), "{:?}", judged(&h));

    // smartctl 7.4 names it "scsi_model_name" and "scsi_revision".
    let h = smartctl(include_str!(
        "../../tests/data/health/smartctl-scsi-grown-defects.json"
    ));
    assert_eq!(ident(&h), "scsi SEAGATE ST373453LC / REDACTED / DX10");
    let want = "cw=- spare=-/- used=- media=- temp=33 passed=true \
                realloc=- pending=- offline=- grown=260";
    assert_eq!(figures(&h), want);
    assert_eq!(judged(&h), ["260 entries in the SCSI grown defect list"]);
}

#[test]
fn smartctl_open_failure_is_an_error() {
    let text = include_str!("../../tests/data/health/smartctl-open-failed.json");
    let e = parse_smartctl_json(text).unwrap_err();
    assert!(
        e.contains("exit status 2") && e.contains("Open failed"),
        "{e}"
    );
    assert!(parse_smartctl_json("not json").is_err());
    assert!(parse_smartctl_json("[1]").is_err());
    assert!(parse_smartctl_json(r#"{"smartctl":{"exit_status":0}}"#).is_err());
}

#[test]
fn nvme_cli_samples() {
    let text = include_str!("../../tests/data/health/nvme-smart-log.json");
    let mut h = parse_nvme_smart_log_json(text).unwrap();
    assert_eq!(ident(&h), "nvme - / - / -");
    // 322 K is 49 °C. nvme-cli gives no overall verdict.
    let want = "cw=0 spare=100/50 used=2 media=0 temp=49 passed=- \
                realloc=- pending=- offline=- grown=-";
    assert_eq!(figures(&h), want);
    assert!(judged(&h).is_empty(), "{:?}", judged(&h));

    let text = include_str!("../../tests/data/health/nvme-id-ctrl.json");
    parse_nvme_id_ctrl_json(text, &mut h).unwrap();
    assert_eq!(
        ident(&h),
        "nvme WDC PC SN730 SDBQNTY-256G-1001 / 1951B3444502 / 11170101"
    );
    assert_eq!(figures(&h), want, "the identity leaves the figures alone");
    assert!(parse_nvme_id_ctrl_json(r#"{"vid": 1}"#, &mut h).is_err());
    assert_eq!(h.serial.as_deref(), Some("1951B3444502"));
}

/// Output variants with no real capture to hand. These strings are
/// constructed from nvme-cli's json_smart_log() and are not samples.
#[test]
fn nvme_cli_smart_log_variants() {
    let verbose = r#"{"critical_warning":{"value":5,"available_spare":1,
        "temp_threshold":0,"reliability_degraded":1,"ro":0,"vmbu_failed":0,"pmr_ro":0},
        "temperature":296,"avail_spare":3,"spare_thresh":10,"percent_used":0}"#;
    let h = parse_nvme_smart_log_json(verbose).unwrap();
    assert_eq!(
        (h.critical_warning, h.temperature_celsius),
        (Some(5), Some(23))
    );
    let w = judged(&h);
    assert!(
        w.len() == 3 && has(&w, "bit 0:") && has(&w, "bit 2:"),
        "{w:?}"
    );
    assert!(has(&w, "available spare is 3%"), "{w:?}");

    let old = r#"{"critical_warning":0,"Temperature":"35 C","avail_spare":100,
        "spare_thresh":10,"percent_used":101,"media_errors":2.0}"#;
    let h = parse_nvme_smart_log_json(old).unwrap();
    let want = "cw=0 spare=100/10 used=101 media=2 temp=35 passed=- \
                realloc=- pending=- offline=- grown=-";
    assert_eq!(figures(&h), want);

    let kelvin = parse_nvme_smart_log_json(r#"{"temperature":"308 K","percentage_used":4}"#);
    assert_eq!(kelvin.unwrap().temperature_celsius, Some(35));
    let unreported = parse_nvme_smart_log_json(r#"{"temperature":0,"percent_used":4}"#);
    assert_eq!(unreported.unwrap().temperature_celsius, None);
    assert!(parse_nvme_smart_log_json(r#"{"vid":1}"#).is_err());
}

fn with(set: impl FnOnce(&mut DriveHealth)) -> DriveHealth {
    let mut h = DriveHealth::default();
    set(&mut h);
    h
}

#[test]
fn each_warning_rule() {
    let t = HealthThresholds::default();
    let one = |h: DriveHealth, needle: &str| {
        let w = warnings(&h, &t);
        assert!(w.len() == 1 && w[0].contains(needle), "{needle}: {w:?}");
    };
    let quiet = |h: DriveHealth| assert!(warnings(&h, &t).is_empty(), "{h:?}");
    quiet(DriveHealth::default());
    let bits = [
        "bit 0: available spare capacity",
        "bit 1: temperature",
        "bit 2: NVM subsystem reliability",
        "bit 3: the media has been placed in read-only mode",
        "bit 4: the volatile memory backup",
        "bit 5: the persistent memory region",
    ];
    for (bit, needle) in bits.into_iter().enumerate() {
        one(with(|h| h.critical_warning = Some(1u8 << bit)), needle);
    }
    let all = with(|h| h.critical_warning = Some(0xff));
    assert_eq!(warnings(&all, &t).len(), 8);
    one(with(|h| h.media_errors = Some(1)), "1 media and data");
    quiet(with(|h| h.media_errors = Some(0)));
    let spare = |s: u8, th: u8| {
        with(|h| {
            h.available_spare_percent = Some(s);
            h.available_spare_threshold_percent = Some(th);
        })
    };
    one(spare(10, 10), "available spare is 10%");
    quiet(spare(11, 10));
    quiet(spare(0, 0)); // a threshold of 0 means the drive sets none
    one(
        with(|h| h.percentage_used = Some(90)),
        "endurance used is 90%",
    );
    quiet(with(|h| h.percentage_used = Some(89)));
    one(with(|h| h.temperature_celsius = Some(70)), "is 70 °C");
    quiet(with(|h| h.temperature_celsius = Some(69)));
    one(with(|h| h.smart_passed = Some(false)), "says FAILED");
    quiet(with(|h| h.smart_passed = Some(true)));
    one(with(|h| h.reallocated_sectors = Some(3)), "3 reallocated");
    one(with(|h| h.pending_sectors = Some(4)), "4 sectors pending");
    one(with(|h| h.offline_uncorrectable = Some(5)), "5 offline");
    one(with(|h| h.grown_defects = Some(6)), "6 entries in the SCSI");
    quiet(with(|h| h.grown_defects = Some(0)));
}

#[test]
fn thresholds_defaults_and_unknown_fields() {
    let t: HealthThresholds = serde_json::from_str("{}").unwrap();
    assert_eq!((t.percentage_used, t.temperature_celsius), (90, 70));
    let t: HealthThresholds = serde_json::from_str(r#"{"temperature_celsius": 55}"#).unwrap();
    assert_eq!((t.percentage_used, t.temperature_celsius), (90, 55));
    assert!(serde_json::from_str::<HealthThresholds>(r#"{"temp": 55}"#).is_err());
}

#[test]
fn probe_regular_file_is_not_a_drive() {
    let name = format!("raidctl-health-{}.img", std::process::id());
    let p: PathBuf = std::env::temp_dir().join(name);
    std::fs::write(&p, b"not a disk").unwrap();
    let r = probe(&p);
    let _ = std::fs::remove_file(&p);
    assert_eq!(r, Probe::NotADrive);
    let missing = probe(Path::new("/nonexistent/raidctl-health"));
    assert!(matches!(missing, Probe::Failed(_)), "{missing:?}");
}
