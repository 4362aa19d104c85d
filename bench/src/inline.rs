//! `--inline`: the application's loop runs inside each worker's own loop, eRPC's model.
//!
//! Each worker's stage is the engines' `RdmaStage` wrapped in an [`InlineStage`]. After the
//! engines' work of an iteration (`on_poll`: doorbells, timers, transmit, completions), the
//! stage runs one round of the loop a host would otherwise run on its own core: post what is
//! due and fits, poll the completion queues. The work requests and completions still pass
//! through the queue pair's rings, but both ends of every ring are on the worker's core, so no
//! cache line crosses between cores per operation, and no host thread spins. The calling
//! thread hands worker `t` the loop of the connections homed on it (`point::Runner::inline`)
//! and sleeps until the loops come back.

use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};

use portico::dataplane::Burst;
use portico::dataplane::wake::Wake;
use portico::rdma::RdmaStage;
use portico::rdma::loopback::StageWrap;
use portico::runtime::{Counters, Outlook, Outputs, Polling, Stage, StageBox};

use crate::point::InlineApp;

/// A worker's stage with an application loop run inside it.
pub(crate) struct InlineStage {
    inner: RdmaStage,
    inbox: Receiver<InlineApp>,
    app: Option<InlineApp>,
}

/// The wrapper for `workers` workers, and where each takes its loops.
pub(crate) fn wrap(workers: usize) -> (StageWrap, Vec<Sender<InlineApp>>) {
    let (senders, receivers): (Vec<_>, Vec<_>) = (0..workers).map(|_| mpsc::channel()).unzip();
    let receivers = Arc::new(Mutex::new(
        receivers.into_iter().map(Some).collect::<Vec<_>>(),
    ));
    let wrap = StageWrap::new(move |i, inner| {
        let inbox = receivers
            .lock()
            .ok()
            .and_then(|mut r| r.get_mut(i).and_then(Option::take))
            // A worker the run did not plan for gets loops from nobody.
            .unwrap_or_else(|| mpsc::channel().1);
        StageBox::new(InlineStage {
            inner,
            inbox,
            app: None,
        })
    });
    (wrap, senders)
}

impl Stage for InlineStage {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn counter_names(&self) -> &'static [&'static str] {
        self.inner.counter_names()
    }

    fn start(&mut self, polling: Polling) {
        self.inner.start(polling);
    }

    fn is_finite(&self) -> bool {
        self.inner.is_finite()
    }

    fn is_done(&self) -> bool {
        self.inner.is_done()
    }

    fn outlook(&mut self) -> Outlook {
        self.inner.outlook()
    }

    fn wakes(&self) -> Vec<Arc<Wake>> {
        self.inner.wakes()
    }

    fn host_work_pending(&self) -> bool {
        // A loop in progress is work: the worker must not sleep under it.
        self.app.is_some() || self.inner.host_work_pending()
    }

    fn slept(&mut self, ns: u64) {
        self.inner.slept(ns);
    }

    fn on_rx(&mut self, input: usize, burst: &mut Burst, out: &mut Outputs, c: &mut Counters) {
        self.inner.on_rx(input, burst, out, c);
    }

    fn on_poll(&mut self, out: &mut Outputs, c: &mut Counters) {
        self.inner.on_poll(out, c);
        if self.app.is_none() {
            self.app = self.inbox.try_recv().ok();
        }
        if let Some(app) = self.app.as_mut()
            && app()
        {
            self.app = None;
        }
    }

    fn on_stop(&mut self, c: &mut Counters) {
        self.inner.on_stop(c);
    }
}
