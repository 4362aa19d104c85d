//! A header and its data to a target's buffer list in one RDMA WRITE with immediate (or the
//! fewest, when the buffers are not contiguous in the target's address space), by the plan of
//! [`proto::placement`] (seed 003).

use super::{Qp, QueueFull};
use proto::placement::{Buffer, GatherError, Layout, PlanError, Planner, Request, Sources, gather};

/// What [`Qp::post_placed`] posted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placed {
    /// The plan: which buffers, where the data and the header go.
    pub layout: Layout,
    /// WRITEs posted (each completes on its own, with the caller's `wr_id`; the last carries
    /// the immediate).
    pub writes: usize,
    /// Bytes the WRITEs carry: header, data and waste.
    pub carried: u64,
    /// The immediate: the header's offset in the target's buffer list.
    pub immediate: u32,
}

/// Why nothing was posted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PlaceError {
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Gather(#[from] GatherError),
    /// The send ring has room for fewer WRITEs than the plan needs; nothing was posted.
    #[error("the send ring has room for {space} requests, the plan needs {need}")]
    Full { need: usize, space: usize },
}

impl Qp {
    /// Plans `req` into the target's buffers `target` (all in the target's region `rkey`),
    /// then posts the WRITEs that carry it, gathered from `src`, with one doorbell: all of
    /// them or none. The target learns the header's offset from the last WRITE's immediate
    /// (its receive completes with it) and finds the data with
    /// [`proto::placement::locate`]. The source buffers belong to the engine until every
    /// WRITE has completed. `planner` keeps its scratch between calls (no allocation).
    pub fn post_placed(
        &mut self,
        planner: &mut Planner,
        req: &Request,
        target: &[Buffer],
        rkey: u32,
        src: &Sources,
        wr_id: u64,
    ) -> Result<Placed, PlaceError> {
        let layout = planner.plan(req, target)?;
        let writes = gather(&layout, req, target, rkey, src, wr_id)?;
        let wrs = writes.as_slice();
        let space = self.send_space();
        if space < wrs.len() {
            return Err(PlaceError::Full {
                need: wrs.len(),
                space,
            });
        }
        self.post_send(wrs).map_err(|QueueFull { posted }| {
            // One producer per ring: the room just counted cannot shrink.
            debug_assert!(
                false,
                "posted {posted} of {} after counting room",
                wrs.len()
            );
            PlaceError::Full {
                need: wrs.len(),
                space: posted,
            }
        })?;
        Ok(Placed {
            layout,
            writes: wrs.len(),
            carried: writes.carried,
            immediate: writes.immediate,
        })
    }
}
