//! `portico run`: a [`Scenario`] from a config file becomes ports (ring links created here,
//! vdevs and PCI devices probed by EAL) and workers (generators, checkers, forwarders); after
//! the run each checker is paired with the generators at the other end of its link for its
//! verdict.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use crate::config::{PortSource, QueueRef, Scenario, Task, vdev_driver};
use crate::dataplane::{self, Mempool, Port, PortConfig};
use crate::hugepages::HugepageStatus;
use crate::report;
use crate::runtime::{
    FaultInjector, StageBox, TxPolicy, WorkerCapture, WorkerReport, WorkerSpec, polling,
};
use crate::summary::{CheckVerdict, Summary};
use crate::traffic::frame::FrameSpec;
use crate::traffic::{CheckCounters, Checker, Forward, GenerateCounters, Generator};

use super::AppError;
use super::eal::{DeviceArg, available_cores, main_core_for, plan_eal_args, start_eal};
use super::monitor::{RunOpts, close_capture, execute, open_capture};
use super::ports::{POOL_CACHE, check_pool_fits, pool_layout, pool_size};

/// Runs a scenario from a config file.
pub fn run_scenario(
    scenario: &Scenario,
    extra_eal: &[String],
    opts: &RunOpts,
    interrupted: Arc<AtomicBool>,
) -> Result<Summary, AppError> {
    let cores = available_cores();
    let worker_cores: Vec<usize> = scenario.workers.iter().map(|w| w.core).collect();
    let devices: Vec<DeviceArg> = scenario
        .sources
        .iter()
        .filter_map(|s| match s {
            PortSource::Vdev(v) => Some(DeviceArg::Vdev(v.clone())),
            PortSource::Pci(p) => Some(DeviceArg::Pci(p.clone())),
            PortSource::Ring { .. } => None,
        })
        .collect();
    let mut user = scenario.eal.args.clone();
    user.extend(extra_eal.iter().cloned());
    let (args, memory) = plan_eal_args(
        &user,
        scenario.eal.hugepages,
        scenario.eal.memory_mb,
        main_core_for(&worker_cores, &cores),
        &devices,
        &HugepageStatus::read(),
    )?;
    let port_cfgs: Vec<PortConfig> = scenario
        .ports
        .iter()
        .map(|p| PortConfig {
            rx_queues: p.rx_queues,
            tx_queues: p.tx_queues,
            rx_desc: p.rx_desc,
            tx_desc: p.tx_desc,
            promiscuous: true,
            mac: None,
            reconnect: None,
        })
        .collect();
    let mbufs = pool_size(&port_cfgs, scenario.workers.len());
    check_pool_fits(
        &memory,
        mbufs,
        dpdk_sys::RTE_MBUF_DEFAULT_BUF_SIZE as u16,
        ("eal.memory_mb", "eal.hugepages"),
        "ports[].rx_queues/tx_queues/rx_desc/tx_desc",
    )?;
    let polling = polling::effective(scenario.polling);
    let started = start_eal(args, memory, Some(polling), opts.json)?;

    // Resolve port ids: ring links are created here, vdevs and PCI devices were probed by EAL.
    let mut ids: Vec<Option<u16>> = vec![None; scenario.ports.len()];
    let mut links: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, src) in scenario.sources.iter().enumerate() {
        match src {
            PortSource::Ring { link } => links.entry(link).or_default().push(i),
            PortSource::Vdev(v) => {
                let (dev, _) = vdev_driver(v);
                ids[i] = Some(dataplane::port_by_name(dev).ok_or_else(|| {
                    AppError::Usage(format!("ports[{i}].vdev: EAL probed no port named {dev}"))
                })?);
            }
            PortSource::Pci(p) => {
                ids[i] = Some(dataplane::port_by_name(p).ok_or_else(|| {
                    AppError::Usage(format!(
                        "ports[{i}].pci: no DPDK port at {p} (is it bound to vfio-pci or uio?)"
                    ))
                })?);
            }
        }
    }
    for members in links.values() {
        let (a, b) = (members[0], members[1]);
        let ring_size = (scenario.ports[a].tx_desc.max(scenario.ports[b].tx_desc) as u32 * 2)
            .next_power_of_two();
        let (pa, pb) =
            dataplane::ring_pair(&scenario.ports[a].name, &scenario.ports[b].name, ring_size)?;
        ids[a] = Some(pa);
        ids[b] = Some(pb);
    }

    let ids: Vec<u16> = ids
        .into_iter()
        .map(|id| id.expect("every port resolved above"))
        .collect();
    let pool = Arc::new(Mempool::with_layout(
        "portico_pool",
        mbufs,
        POOL_CACHE,
        dpdk_sys::RTE_MBUF_DEFAULT_BUF_SIZE as u16,
        -1,
        pool_layout(&ids)?,
    )?);
    let mut ports = Vec::new();
    for (i, cfg) in port_cfgs.iter().enumerate() {
        let id = ids[i];
        let port = Port::start(id, cfg, pool.clone())?.named(&scenario.ports[i].name);
        ports.push(port);
    }
    let names: Vec<String> = scenario.ports.iter().map(|p| p.name.clone()).collect();
    let capture = open_capture(opts, &ports)?;

    // The config check gave every queue to one worker at most, so a queue that is not there
    // is Portico's fault, not the config's: a run-time failure.
    let take_rx = |q: QueueRef| {
        ports[q.port].rx_queue(q.queue).ok_or_else(|| {
            AppError::Failed(format!(
                "RX queue {}:{} is not available",
                names[q.port], q.queue
            ))
        })
    };
    let take_tx = |q: QueueRef| {
        ports[q.port].tx_queue(q.queue).ok_or_else(|| {
            AppError::Failed(format!(
                "TX queue {}:{} is not available",
                names[q.port], q.queue
            ))
        })
    };
    let burst = scenario.run.burst;
    let mut specs = Vec::new();
    for w in &scenario.workers {
        let (rx, tx, stage): (_, _, StageBox) = match &w.task {
            Task::Generate {
                tx,
                frame_size,
                rate_pps,
                count,
            } => {
                let spec = FrameSpec {
                    frame_size: *frame_size,
                    ..FrameSpec::default()
                };
                let gen_ = Generator::new(pool.clone(), &spec, *rate_pps, *count, burst, 0);
                (
                    vec![],
                    vec![(take_tx(*tx)?, TxPolicy::KeepUnsent)],
                    StageBox::new(gen_),
                )
            }
            Task::Check { rx, expect } => (
                vec![take_rx(*rx)?],
                vec![],
                StageBox::new(Checker::new(*expect)),
            ),
            Task::Forward { mode, paths } => {
                let mut rx = Vec::new();
                let mut outs: Vec<QueueRef> = Vec::new();
                let mut map = Vec::new();
                for (r, t) in paths {
                    rx.push(take_rx(*r)?);
                    let o = match outs.iter().position(|x| x == t) {
                        Some(o) => o,
                        None => {
                            outs.push(*t);
                            outs.len() - 1
                        }
                    };
                    map.push(o);
                }
                let tx = outs
                    .iter()
                    .map(|t| Ok((take_tx(*t)?, TxPolicy::DropUnsent)))
                    .collect::<Result<Vec<_>, AppError>>()?;
                (rx, tx, StageBox::new(Forward::new(*mode, map)))
            }
        };
        specs.push(WorkerSpec {
            name: w.name.clone(),
            core: Some(w.core),
            rx,
            tx,
            burst,
            stage,
            faults: w.faults.map(|f| FaultInjector::new(&f, pool.clone())),
            capture: capture.as_ref().map(|s| WorkerCapture::new(s.clone())),
            polling,
        });
    }
    report::plan(&scenario.workers, &names, opts.json);

    let mut summary = execute(specs, &ports, started, "run", true, opts, interrupted)?;
    close_capture(capture, opts, &mut summary)?;
    summary.checks = verdicts(scenario, &summary.workers);
    if let Some(bad) = summary.checks.iter().find(|c| !c.passed) {
        report::summary(&summary, opts.json);
        return Err(AppError::CheckFailed(format!(
            "worker {}: sent {}, valid {}, invalid {}, sequence gaps {}, late {}",
            bad.worker,
            bad.sent
                .map(|s| s.to_string())
                .unwrap_or_else(|| "?".into()),
            bad.valid,
            bad.invalid,
            bad.seq_gaps,
            bad.late
        )));
    }
    Ok(summary)
}

/// Pairs each checker with the generators at the other end of its ring link.
fn verdicts(s: &Scenario, reports: &[WorkerReport]) -> Vec<CheckVerdict> {
    let peer_of = |port: usize| -> Option<usize> {
        let PortSource::Ring { link } = &s.sources[port] else {
            return None;
        };
        (0..s.sources.len()).find(|&p| {
            p != port && matches!(&s.sources[p], PortSource::Ring { link: l } if l == link)
        })
    };
    s.workers
        .iter()
        .zip(reports)
        .filter_map(|(w, r)| {
            let Task::Check { rx, .. } = w.task else {
                return None;
            };
            // The generators' counters, combined as declared (`generated` summed).
            let sent = peer_of(rx.port).and_then(|peer| {
                s.workers
                    .iter()
                    .zip(reports)
                    .filter(|(g, _)| matches!(g.task, Task::Generate { tx, .. } if tx.port == peer))
                    .map(|(_, gr)| GenerateCounters::from_pairs(gr.counter_pairs()))
                    .reduce(|mut all, g| {
                        all.combine(&g);
                        all
                    })
                    .map(|all| all.generated)
            });
            let CheckCounters {
                valid,
                invalid,
                seq_gaps,
                late,
                ..
            } = CheckCounters::from_pairs(r.counter_pairs());
            // What the generators on the other end sent, else what the config expects.
            let expected = sent.or(match w.task {
                Task::Check { expect, .. } => expect,
                _ => None,
            });
            // Injected faults change what must arrive, exactly: each drop or corruption
            // removes one valid frame, each duplicate adds one, each corruption is one invalid
            // frame; drops and reorders show up as gaps and late frames.
            let f = r.faults;
            let faulty = w.faults.is_some();
            let expected_valid =
                expected.map(|s| (s + f.duplicated).saturating_sub(f.dropped + f.corrupted));
            Some(CheckVerdict {
                worker: r.worker.clone(),
                sent: expected,
                expected_valid,
                valid,
                invalid,
                seq_gaps,
                late,
                passed: invalid == f.corrupted
                    && (faulty || (seq_gaps == 0 && late == 0))
                    && expected_valid.is_none_or(|e| e == valid),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::FaultCounts;

    /// A generator on ring port `a` sending 1000 frames to a checker on port `b`.
    fn loopback(checker_faults: &str) -> Scenario {
        let text = format!(
            r#"
            [[ports]]
            name = "a"
            ring = "wire"
            [[ports]]
            name = "b"
            ring = "wire"
            [[workers]]
            core = 0
            task = "generate"
            port = "a"
            count = 1000
            [[workers]]
            core = 1
            task = "check"
            port = "b"
            {checker_faults}
            "#
        );
        Scenario::parse(&text, &[0, 1], &[]).unwrap()
    }

    fn report(worker: &str, counters: &[(&str, u64)], faults: FaultCounts) -> WorkerReport {
        WorkerReport {
            worker: worker.into(),
            core: None,
            stage: String::new(),
            io: Default::default(),
            counters: counters.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            faults,
            idle: Default::default(),
            cpu_ns: 0,
            wall_ns: 0,
        }
    }

    fn check(
        s: &Scenario,
        generated: u64,
        checked: &[(&str, u64)],
        f: FaultCounts,
    ) -> CheckVerdict {
        let reports = [
            report("gen", &[("generated", generated)], FaultCounts::default()),
            report("chk", checked, f),
        ];
        let v = verdicts(s, &reports);
        assert_eq!(v.len(), 1, "one verdict per checker");
        v[0].clone()
    }

    #[test]
    fn checker_counts_what_the_generator_across_the_link_sent() {
        let s = loopback("");
        let v = check(&s, 1000, &[("valid", 1000)], FaultCounts::default());
        assert_eq!(
            (v.sent, v.expected_valid, v.passed),
            (Some(1000), Some(1000), true)
        );
        let v = check(&s, 1000, &[("valid", 999)], FaultCounts::default());
        assert!(!v.passed, "one frame lost");
        let v = check(
            &s,
            1000,
            &[("valid", 1000), ("seq_gaps", 1)],
            FaultCounts::default(),
        );
        assert!(!v.passed, "a gap without injected faults");
    }

    #[test]
    fn injected_faults_adjust_what_must_arrive() {
        let s = loopback("faults = { seed = 1, drop = 0.01, duplicate = 0.01, corrupt = 0.01 }");
        let f = FaultCounts {
            dropped: 5,
            duplicated: 3,
            reordered: 0,
            corrupted: 2,
        };
        let v = check(
            &s,
            1000,
            &[("valid", 996), ("invalid", 2), ("seq_gaps", 5)],
            f,
        );
        assert_eq!(v.expected_valid, Some(1000 + 3 - 5 - 2));
        assert!(v.passed, "{v:?}");
        let v = check(&s, 1000, &[("valid", 996), ("invalid", 3)], f);
        assert!(!v.passed, "an invalid frame that was not injected");
    }
}
