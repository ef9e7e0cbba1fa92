use super::*;

fn reading(index: &str, u: f64, mem: u64) -> GpuReading {
    GpuReading {
        index: index.into(),
        utilization_percent: Some(u),
        memory_used_mb: Some(mem),
    }
}

impl GpuUsage {
    fn add_p(&mut self, p: &GpuPoint) {
        self.add(p, IDLE_BELOW_PERCENT);
    }
}

fn at(s: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(1_800_000_000 + s, 0).expect("time")
}

#[test]
fn a_part_sees_only_its_own_gpus() {
    let node = [
        reading("0", 90.0, 1000),
        reading("1", 10.0, 3000),
        reading("2", 100.0, 9000),
    ];
    let p = point(at(0), 5.0, &["0".into(), "1".into()], &node).expect("point");
    assert_eq!(p.gpus, 2);
    assert_eq!(p.utilization_percent, 50.0);
    assert_eq!(p.max_utilization_percent, 90.0);
    assert_eq!(p.max_memory_used_mb, 3000);
    assert!(!p.idle());
    // A part whose GPUs were not read (or read as N/A) has no point.
    let na = GpuReading {
        index: "3".into(),
        utilization_percent: None,
        memory_used_mb: None,
    };
    assert_eq!(point(at(0), 5.0, &["3".into()], &[na]), None);
    assert_eq!(point(at(0), 5.0, &["7".into()], &node), None);
}

/// Whatever a reader lists, the point is one the server takes: a GPU
/// listed twice counts once, and the mean of equal readings is not
/// rounded above their max (found by the fuzz target `smi`).
#[test]
fn a_point_from_any_reading_passes_the_servers_check() {
    let thirds = [
        reading("0", 0.1, 1),
        reading("1", 0.1, 1),
        reading("2", 0.1, 1),
    ];
    let gpus: Vec<String> = ["0", "1", "2"].map(String::from).to_vec();
    let p = point(at(0), 5.0, &gpus, &thirds).expect("point");
    assert_eq!(p.check(), Ok(()));
    assert_eq!(p.utilization_percent, 0.1);
    let twice = [reading("0", 90.0, 1000), reading("0", 10.0, 3000)];
    let p = point(at(0), 5.0, &["0".into()], &twice).expect("point");
    assert_eq!(
        (p.gpus, p.utilization_percent, p.max_memory_used_mb),
        (1, 90.0, 1000)
    );
    assert_eq!(p.check(), Ok(()));
}
/// A scripted series: 4 GPUs busy at 80 % for 60 s, then idle for 60 s
/// on one part of 2 GPUs while the other 2 stay at 80 %.
#[test]
fn a_series_adds_up_to_its_mean_p95_peak_and_idle_time() {
    let mut u = GpuUsage::default();
    for s in (5..=60).step_by(5) {
        for part in [["0", "1"], ["2", "3"]] {
            let gpus: Vec<String> = part.iter().map(|g| g.to_string()).collect();
            let node: Vec<GpuReading> = part.iter().map(|g| reading(g, 80.0, 20_000)).collect();
            u.add_p(&point(at(s), 5.0, &gpus, &node).expect("point"));
        }
    }
    assert_eq!(u.idle_since(), None);
    for s in (65..=120).step_by(5) {
        let busy: Vec<GpuReading> = ["2", "3"]
            .iter()
            .map(|g| reading(g, 80.0, 20_500))
            .collect();
        let idle: Vec<GpuReading> = ["0", "1"].iter().map(|g| reading(g, 0.0, 500)).collect();
        u.add_p(&point(at(s), 5.0, &["2".into(), "3".into()], &busy).expect("point"));
        u.add_p(&point(at(s), 5.0, &["0".into(), "1".into()], &idle).expect("point"));
    }
    // 360 GPU-seconds at 80 %, 120 at 0 %: a mean of 60 %.
    assert_eq!(u.gpu_seconds, 480.0);
    assert_eq!(u.mean_percent(), Some(60.0));
    assert_eq!(u.p95_percent(), Some(85.0));
    let v = u.view(4).expect("view");
    assert_eq!(v.peak_memory_mb, 20_500);
    // 120 idle GPU-seconds over a cluster of 4 GPUs: 30 s.
    assert_eq!(v.idle_seconds, 30.0);
    // One part kept working to the end: the batch is not idle.
    assert_eq!(u.idle_since(), None);
    // A batch whose every point is idle has been idle since the first.
    let mut idle = GpuUsage::default();
    for s in [5, 10, 15] {
        idle.add_p(&point(at(s), 5.0, &["0".into()], &[reading("0", 1.0, 10)]).expect("p"));
    }
    assert_eq!(idle.idle_since(), Some(at(0)));
    assert_eq!(idle.p95_percent(), Some(5.0));
    // A busy point ends it; idle points after start it again there.
    idle.add_p(&point(at(20), 5.0, &["0".into()], &[reading("0", 70.0, 10)]).expect("p"));
    assert_eq!(idle.idle_since(), None);
    idle.add_p(&point(at(25), 5.0, &["0".into()], &[reading("0", 0.0, 10)]).expect("p"));
    assert_eq!(idle.idle_since(), Some(at(20)));
}

#[test]
fn a_retried_upload_is_taken_once_per_node() {
    let mut u = GpuUsage::default();
    let p = point(at(5), 5.0, &["0".into()], &[reading("0", 50.0, 1)]).expect("p");
    assert!(u.add_from("n1", &p, 5.0));
    assert!(!u.add_from("n1", &p, 5.0), "the same point again");
    assert!(
        u.add_from("n2", &p, 5.0),
        "another node's point at that time"
    );
    assert_eq!(u.points, 2);
}

#[test]
fn the_idle_policy_waits_for_its_warm_up_and_duration() {
    let policy = IdlePolicy {
        action: IdleAction::Warn,
        below_percent: 10.0,
        after: std::time::Duration::from_secs(60),
        warm_up: std::time::Duration::from_secs(30),
    };
    let nodes = ["n1".to_string()];
    let mut u = GpuUsage::default();
    // Idle from the start (8 % is under 10 %), points every 10 s.
    for s in (10..=80).step_by(10) {
        u.add_from(
            "n1",
            &point(at(s), 10.0, &["0".into()], &[reading("0", 8.0, 1)]).expect("p"),
            10.0,
        );
    }
    // Idle since 0, but counted from the warm-up's end (30): 50 s.
    assert_eq!(idle_verdict(&policy, &u, &nodes, at(0), at(80)), None);
    u.add_from(
        "n1",
        &point(at(90), 10.0, &["0".into()], &[reading("0", 8.0, 1)]).expect("p"),
        10.0,
    );
    let Some(IdleVerdict::Warn(w)) = idle_verdict(&policy, &u, &nodes, at(0), at(90)) else {
        panic!("a warning after 60 s idle past the warm-up");
    };
    assert!(w.contains("under 10% utilization for 1m"), "{w}");
    // Once warned, no second warning; a cancel policy still cancels.
    u.warned = true;
    assert_eq!(idle_verdict(&policy, &u, &nodes, at(0), at(90)), None);
    let cancel = IdlePolicy {
        action: IdleAction::Cancel,
        ..policy.clone()
    };
    assert!(matches!(
        idle_verdict(&cancel, &u, &nodes, at(0), at(90)),
        Some(IdleVerdict::Cancel(_))
    ));
    // A busy point resets it; off never says anything.
    u.add_from(
        "n1",
        &point(at(100), 10.0, &["0".into()], &[reading("0", 60.0, 1)]).expect("p"),
        10.0,
    );
    assert_eq!(idle_verdict(&cancel, &u, &nodes, at(0), at(100)), None);
    let off = IdlePolicy {
        action: IdleAction::Off,
        ..policy
    };
    assert_eq!(idle_verdict(&off, &u, &nodes, at(0), at(1000)), None);
}

#[test]
fn an_idle_node_alone_cannot_declare_the_batch_idle_while_a_busy_nodes_points_lag() {
    let policy = IdlePolicy {
        action: IdleAction::Cancel,
        below_percent: 10.0,
        after: std::time::Duration::from_secs(60),
        warm_up: std::time::Duration::ZERO,
    };
    let nodes = ["busy".to_string(), "idle".to_string()];
    let p = |s: i64, percent: f64| {
        point(at(s), 10.0, &["0".into()], &[reading("0", percent, 1)]).expect("p")
    };
    let mut u = GpuUsage::default();
    // The busy node has sent up to 10 s, the idle one up to 300 s.
    u.add_from("busy", &p(10, 90.0), 10.0);
    for s in (10..=300).step_by(10) {
        u.add_from("idle", &p(s, 1.0), 10.0);
    }
    assert_eq!(u.reported_until(&nodes), Some(at(10)));
    assert_eq!(idle_verdict(&policy, &u, &nodes, at(0), at(300)), None);
    // Its lagging points arrive busy: still working, nothing to say.
    for s in (20..=300).step_by(10) {
        u.add_from("busy", &p(s, 90.0), 10.0);
    }
    assert_eq!(idle_verdict(&policy, &u, &nodes, at(0), at(300)), None);
    // Had they arrived idle, the batch would be idle from 10 s on.
    let mut v = GpuUsage::default();
    v.add_from("busy", &p(10, 90.0), 10.0);
    for s in (10..=300).step_by(10) {
        v.add_from("idle", &p(s, 1.0), 10.0);
    }
    for s in (20..=100).step_by(10) {
        v.add_from("busy", &p(s, 1.0), 10.0);
    }
    // Reported by both up to 100 s: 90 s idle, past the 60 s.
    let Some(IdleVerdict::Cancel(why)) = idle_verdict(&policy, &v, &nodes, at(0), at(300)) else {
        panic!("both nodes idle for 90 s");
    };
    assert!(why.contains("for 1m 30s"), "{why}");
    // A node holding GPUs that has sent nothing yet holds it back too.
    let three = ["busy".to_string(), "idle".to_string(), "new".to_string()];
    assert_eq!(v.reported_until(&three), None);
    assert_eq!(idle_verdict(&policy, &v, &three, at(0), at(300)), None);
    assert_eq!(v.reported_until(&[]), None);
}

#[test]
fn bad_points_are_refused_by_field() {
    let good = point(at(0), 5.0, &["0".into()], &[reading("0", 50.0, 1)]).expect("p");
    assert_eq!(good.check(), Ok(()));
    let bad = GpuPoint {
        utilization_percent: 150.0,
        max_utilization_percent: 150.0,
        ..good.clone()
    };
    assert!(
        bad.check()
            .is_err_and(|e| e.field == "utilizationPercent" && e.description.starts_with("is 150"))
    );
    let bad = GpuPoint {
        seconds: 0.0,
        ..good.clone()
    };
    assert!(
        bad.check()
            .is_err_and(|e| e.field == "seconds" && e.description.starts_with("is 0"))
    );
    let bad = GpuPoint {
        max_utilization_percent: 10.0,
        ..good
    };
    assert!(
        bad.check()
            .is_err_and(|e| e.field == "maxUtilizationPercent"
                && e.description.contains("below utilizationPercent"))
    );
}

fn busy(t: DateTime<Utc>, gpus: u32, u: f64, mem: u64) -> GpuPoint {
    GpuPoint {
        time: t,
        seconds: 5.0,
        gpus,
        utilization_percent: u,
        max_utilization_percent: u,
        max_memory_used_mb: mem,
    }
}

#[test]
fn a_short_run_is_charted_in_ten_second_slots_weighted_by_gpu_seconds() {
    let mut series = GpuSeries::default();
    // 1_800_000_000 is a multiple of 10: slot 0 begins at at(0).
    series.add(&busy(at(3), 4, 80.0, 1000));
    series.add(&busy(at(8), 1, 30.0, 3000));
    series.add(&busy(at(25), 2, 10.0, 500));
    let chart = series.chart();
    assert_eq!(chart.step_seconds, 10);
    let shown: Vec<_> = chart
        .points
        .iter()
        .map(|p| (p.time, p.mean_percent, p.max_percent, p.peak_memory_mb))
        .collect();
    // (80 × 20 + 30 × 5) ÷ 25; slot 1 (at(10)) had no point.
    assert_eq!(
        shown,
        vec![(at(0), 70.0, 80.0, 3000), (at(20), 10.0, 10.0, 500)]
    );
}

#[test]
fn a_long_run_keeps_at_most_the_bounded_slots_and_every_gpu_second() {
    let mut series = GpuSeries::default();
    let mut usage = GpuUsage::default();
    // 5000 s of 5 s points: 500 slots of 10 s would be needed.
    for i in 1..=1000 {
        let p = busy(at(i * 5), 2, (i % 100) as f64, i as u64);
        series.add(&p);
        usage.add_p(&p);
    }
    assert!(series.slots.len() <= SERIES_SLOTS, "{}", series.slots.len());
    // 5000 ÷ 40 = 125 slots > 120: the step doubled to 80 s.
    assert_eq!(series.step_seconds, 80);
    let sum: f64 = series.slots.iter().map(|s| s.gpu_seconds).sum();
    assert_eq!(sum, usage.gpu_seconds);
    let weighted: f64 = series.slots.iter().map(|s| s.weighted_percent).sum();
    assert!((weighted - usage.weighted_percent).abs() < 1e-6);
    let chart = series.chart();
    assert_eq!(chart.points.last().map(|p| p.peak_memory_mb), Some(1000));
    assert!(chart.points.windows(2).all(|w| w[0].time < w[1].time));
}

#[test]
fn points_out_of_order_and_at_the_ends_of_time_take_bounded_room() {
    let mut series = GpuSeries::default();
    series.add(&busy(at(100), 1, 50.0, 1));
    // Before the first slot: the series grows backwards.
    series.add(&busy(at(45), 1, 20.0, 1));
    assert_eq!(series.origin, Some(at(40)));
    assert_eq!(series.chart().points.len(), 2);
    for t in [
        DateTime::<Utc>::MIN_UTC,
        DateTime::<Utc>::MAX_UTC,
        at(-1_000_000_000),
    ] {
        series.add(&busy(t, 1, 90.0, 7));
        assert!(series.slots.len() <= SERIES_SLOTS);
    }
    let chart = series.chart();
    assert!(chart.points.len() <= SERIES_SLOTS);
    assert!(chart.points.windows(2).all(|w| w[0].time < w[1].time));
}

/// A point whose time is the earliest an upload can write (chrono
/// reads `-262143-01-01T00:00:00Z`) passes its check; the usage takes
/// it without overflowing when it goes back its `seconds`.
#[test]
fn a_point_at_the_start_of_time_is_summed_without_overflow() {
    let p: GpuPoint = serde_json::from_str(
        r#"{"time":"-262143-01-01T00:00:00Z","seconds":3600,"gpus":1,
            "utilizationPercent":50,"maxUtilizationPercent":50,"maxMemoryUsedMb":1}"#,
    )
    .expect("chrono reads it");
    assert_eq!(p.time, DateTime::<Utc>::MIN_UTC);
    p.check().expect("its fields are in range");
    let mut usage = GpuUsage::default();
    assert!(usage.add_from("n1", &p, IDLE_BELOW_PERCENT));
    assert_eq!(usage.first_time, Some(DateTime::<Utc>::MIN_UTC));
    let mut series = GpuSeries::default();
    series.add(&p);
    assert!(usage.view(1).is_some());
}

#[test]
fn a_series_is_stored_compactly_and_read_back_whole() {
    let mut series = GpuSeries::default();
    series.add(&busy(at(3), 4, 80.0, 1000));
    let json = serde_json::to_string(&series).expect("json");
    assert!(
        json.contains(r#""slots":[[20.0,1600.0,80.0,1000]]"#),
        "{json}"
    );
    let back: GpuSeries = serde_json::from_str(&json).expect("read back");
    assert_eq!(back, series);
}

proptest::proptest! {
    /// Whatever order points come in, the series stays bounded, keeps
    /// every GPU-second, and each point lies in the slot it was added
    /// to (the chart's slots cover the points' times).
    #[test]
    fn the_series_stays_bounded_and_loses_nothing(
        offsets in proptest::collection::vec((-200_000i64..200_000, 1u32..9), 1..400),
    ) {
        let mut series = GpuSeries::default();
        let mut total = 0.0;
        for (t, gpus) in &offsets {
            series.add(&busy(at(*t), *gpus, 50.0, 1));
            total += f64::from(*gpus) * 5.0;
        }
        proptest::prop_assert!(series.slots.len() <= SERIES_SLOTS);
        let sum: f64 = series.slots.iter().map(|s| s.gpu_seconds).sum();
        proptest::prop_assert!((sum - total).abs() < 1e-6, "{} != {}", sum, total);
        let origin = series.origin.expect("origin");
        let step = chrono::Duration::seconds(series.step_seconds);
        let end = origin + step * series.slots.len() as i32;
        for (t, _) in &offsets {
            proptest::prop_assert!(origin <= at(*t) && at(*t) < end);
        }
    }
}
