//! Online reencryption: a served LUKS2 volume whose header is in reencryption is re-keyed (or,
//! with a detached header, decrypted) by its server in the background, hotzone by hotzone,
//! with the offline engine's commit order and metadata (so `reencrypt --resume-only` of dmkit
//! or cryptsetup continues what a close or a crash left). Requests go through
//! [`Reencrypting`]: the part on the rewritten side of the boundary with the new key (or
//! plaintext), the rest with the old one; a request touching the hotzone waits until it is
//! committed, the others go on. No request sees a mix: the boundary only moves over the
//! hotzone, and only while no request touches it. A re-key walks forward (new data below the
//! boundary), a decryption backward (new data above it), as cryptsetup 2.6 walks them.

use super::LuksError;
use super::LuksVolume;
use crate::block::online::{Gate, Online, OnlineError, Unlock};
use crate::block::{check_range, BlockDevice, BlockError, Result as BlockResult};
use crate::crypt::luks2::activate::ActivateOptions;
use crate::crypt::luks2::reencrypt::{engine, Hotzones, Progress, RunOptions, RunOutcome};
use crate::crypt::luks2::reencrypt_open::segment_view;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};

/// Where the boundary and the hotzone are, and the requests in flight.
#[derive(Default)]
struct Zone {
    /// The boundary between old and new data (see [`Reencrypting::forward`]).
    boundary: u64,
    /// The hotzone being rewritten, `[start, end)`.
    hot: Option<(u64, u64)>,
    /// The hotzone failed: its content is uncertain, requests touching it fail.
    failed: bool,
    next: u64,
    inflight: BTreeMap<u64, (u64, u64)>,
}

fn overlaps((s, e): (u64, u64), start: u64, end: u64) -> bool {
    s < end && start < e
}

/// The device served during an online reencryption (see the module documentation).
pub(super) struct Reencrypting {
    name: String,
    size: u64,
    block: u32,
    read_only: bool,
    /// A re-key forward: the new data below the boundary; backward (a decryption), above.
    forward: bool,
    new: Arc<dyn BlockDevice>,
    /// The old key's view; dropped (its key schedule with it) once everything is re-keyed.
    old: RwLock<Option<Arc<dyn BlockDevice>>>,
    zone: Mutex<Zone>,
    moved: Condvar,
}

impl Reencrypting {
    fn zone(&self) -> MutexGuard<'_, Zone> {
        self.zone.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wait<'a>(&self, g: MutexGuard<'a, Zone>) -> MutexGuard<'a, Zone> {
        self.moved.wait(g).unwrap_or_else(|e| e.into_inner())
    }

    /// Run `f(device, offset on it, offset in the request, length)` over
    /// `[offset, offset + len)`, each side of the boundary with its own view.
    fn io(
        &self,
        offset: u64,
        len: u64,
        mut f: impl FnMut(&dyn BlockDevice, u64, usize, usize) -> BlockResult<()>,
    ) -> BlockResult<()> {
        check_range(&self.name, offset, len as usize, self.size)?;
        let end = offset + len;
        let (id, boundary) = {
            let mut z = self.zone();
            while z.hot.is_some_and(|h| overlaps(h, offset, end)) {
                if z.failed {
                    return Err(BlockError::Io {
                        device: self.name.clone(),
                        offset,
                        source: std::io::Error::other("the reencryption hotzone failed"),
                    });
                }
                z = self.wait(z);
            }
            let id = z.next;
            z.next += 1;
            z.inflight.insert(id, (offset, end));
            (id, z.boundary)
        };
        let r = (|| {
            let old = || {
                let old = self.old.read().unwrap_or_else(|e| e.into_inner()).clone();
                old.ok_or_else(|| BlockError::Io {
                    device: self.name.clone(),
                    offset,
                    source: std::io::Error::other("no old key on the old side of the boundary"),
                })
            };
            if offset < boundary {
                let n = len.min(boundary - offset);
                if self.forward {
                    f(self.new.as_ref(), offset, 0, n as usize)?;
                } else {
                    f(old()?.as_ref(), offset, 0, n as usize)?;
                }
            }
            if end > boundary {
                let s = offset.max(boundary);
                let (from, n) = ((s - offset) as usize, (end - s) as usize);
                if self.forward {
                    f(old()?.as_ref(), s, from, n)?;
                } else {
                    f(self.new.as_ref(), s, from, n)?;
                }
            }
            Ok(())
        })();
        self.zone().inflight.remove(&id);
        self.moved.notify_all();
        r
    }

    /// The run failed inside a hotzone: requests touching it fail from now on.
    fn fail(&self) {
        self.zone().failed = true;
        self.moved.notify_all();
    }

    /// Bytes rewritten.
    fn done(&self) -> u64 {
        let b = self.zone().boundary;
        if self.forward {
            b
        } else {
            self.size - b
        }
    }
}

impl Hotzones for Reencrypting {
    fn start(&self, boundary: u64) {
        self.zone().boundary = boundary;
    }

    fn enter(&self, offset: u64, len: u64) {
        let end = offset + len;
        let mut z = self.zone();
        z.hot = Some((offset, end));
        while z.inflight.values().any(|&r| overlaps(r, offset, end)) {
            z = self.wait(z);
        }
    }

    fn leave(&self, boundary: u64) {
        {
            let mut z = self.zone();
            z.boundary = boundary;
            z.hot = None;
        }
        self.moved.notify_all();
        let finished = if self.forward {
            boundary >= self.size
        } else {
            boundary == 0
        };
        if finished {
            *self.old.write().unwrap_or_else(|e| e.into_inner()) = None;
        }
    }
}

impl BlockDevice for Reencrypting {
    fn name(&self) -> &str {
        &self.name
    }
    fn size(&self) -> u64 {
        self.size
    }
    fn logical_block_size(&self) -> u32 {
        self.block
    }
    fn read_only(&self) -> bool {
        self.read_only
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> BlockResult<()> {
        self.io(offset, buf.len() as u64, |d, at, from, n| {
            d.read_at(&mut buf[from..from + n], at)
        })
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> BlockResult<()> {
        if self.read_only {
            return Err(BlockError::ReadOnly {
                device: self.name.clone(),
            });
        }
        self.io(offset, buf.len() as u64, |d, at, from, n| {
            d.write_at(&buf[from..from + n], at)
        })
    }
    fn flush(&self) -> BlockResult<()> {
        // Both views write the same backing file: one flush covers both.
        self.new.flush()
    }
    fn discard(&self, offset: u64, len: u64) -> BlockResult<()> {
        self.io(offset, len, |d, at, _, n| d.discard(at, n as u64))
    }
}

/// Where a served volume lives: what its server needs to reencrypt it.
pub(super) struct Place {
    /// The data device.
    pub device: PathBuf,
    /// The detached header, if any.
    pub header: Option<PathBuf>,
    /// The activation options (name, discards, mode).
    pub opts: ActivateOptions,
}

/// A reencryption job's progress, for `status`.
#[derive(Default)]
struct Job {
    running: bool,
    finished: bool,
    size: u64,
    device: Option<Arc<Reencrypting>>,
}

/// The online reencryption of one served volume: at most one job at a time, stopped at a
/// hotzone boundary by a close.
pub(super) struct Reencryptor {
    place: Place,
    gate: Arc<Gate>,
    job: Mutex<Job>,
    ended: Condvar,
    stop: AtomicBool,
    done: AtomicU64,
}

fn failure(e: LuksError) -> OnlineError {
    OnlineError {
        code: e.exit_code(),
        message: e.to_string(),
    }
}

impl Reencryptor {
    /// Reencrypt `place`, served through `gate`.
    pub fn new(place: Place, gate: Arc<Gate>) -> Reencryptor {
        Reencryptor {
            place,
            gate,
            job: Mutex::new(Job::default()),
            ended: Condvar::new(),
            stop: AtomicBool::new(false),
            done: AtomicU64::new(0),
        }
    }

    fn job(&self) -> MutexGuard<'_, Job> {
        self.job.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a reencryption runs or ran (the served device is then no longer one crypt
    /// target: resize, suspend and refresh are refused until the device is opened again).
    pub fn started(&self) -> bool {
        let j = self.job();
        j.running || j.finished || j.device.is_some()
    }

    /// Refuse `what` while reencrypting (or after, until reopened).
    pub fn refuse(&self, what: &str) -> Result<(), OnlineError> {
        if self.started() {
            return Err(OnlineError {
                code: 5,
                message: format!(
                    "Device {} is in (or was reencrypted by) an online reencryption; {what} needs it closed and opened again.",
                    self.place.opts.name
                ),
            });
        }
        Ok(())
    }

    /// Run a reencryption to its end (see [`Online::reencrypt`]).
    pub fn run(
        &self,
        u: &Unlock,
        max_hotzone: Option<u64>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<(), OnlineError> {
        if self.place.opts.read_only {
            return Err(OnlineError::invalid(format!(
                "Device {} is read-only; cannot reencrypt it.",
                self.place.opts.name
            )));
        }
        {
            let mut j = self.job();
            if j.running {
                return Err(OnlineError {
                    code: 5,
                    message: format!(
                        "Device {} is already being reencrypted.",
                        self.place.opts.name
                    ),
                });
            }
            if self.stop.load(Ordering::SeqCst) {
                return Err(OnlineError::invalid("the device is being closed"));
            }
            j.running = true;
        }
        let r = self.run_locked(u, max_hotzone, progress);
        let mut j = self.job();
        j.running = false;
        if matches!(r, Ok(RunOutcome::Finished)) {
            j.finished = true;
        }
        drop(j);
        self.ended.notify_all();
        crate::crypt::secret::burn_stack();
        match r {
            Ok(RunOutcome::Finished) => Ok(()),
            Ok(RunOutcome::Stopped) => Err(OnlineError::invalid(
                "Reencryption interrupted (the device is being closed); resume it with reencrypt --resume-only.",
            )),
            Err(e) => Err(e),
        }
    }

    fn run_locked(
        &self,
        u: &Unlock,
        max_hotzone: Option<u64>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<RunOutcome, OnlineError> {
        let p = &self.place;
        let mut vol =
            LuksVolume::open(&p.device, p.header.as_deref(), true, None).map_err(failure)?;
        let st = vol
            .reencryption()
            .map_err(failure)?
            .ok_or_else(|| OnlineError::invalid("Device reencryption not in progress."))?;
        let data = match &p.header {
            Some(_) => Some(
                crate::block::open_device(&p.device, false, false)
                    .map_err(|e| failure(LuksError::from(e)))?,
            ),
            None => None,
        };
        let io_block = super::reencrypt::io_block(data.as_ref().unwrap_or(&vol.dev));
        let LuksVolume { dev, header, .. } = &mut vol;
        let super::Header::V2(h) = header else {
            return Err(OnlineError::invalid("reencryption is LUKS2 only"));
        };
        let keys = engine::unlock_keys(dev, h, &st, &u.passphrase, u.key_slot).map_err(failure)?;
        let data_dev: &dyn BlockDevice = match &data {
            Some(d) => d,
            None => dev,
        };
        let lower: Arc<dyn BlockDevice> = Arc::new(
            match &data {
                Some(d) => d.reopened(),
                None => dev.reopened(),
            }
            .map_err(|e| {
                OnlineError::invalid(format!("{}: cannot reopen: {e}", p.device.display()))
            })?,
        );
        let hdr_dev: &dyn BlockDevice = dev;
        let run = engine::Run::new(hdr_dev, data_dev, h, &keys).map_err(failure)?;
        let size = run.device_size();
        if size != self.gate.size() {
            return Err(OnlineError::invalid(format!(
                "{}: {} bytes are served but the reencryption covers {size}; resize is not supported during reencryption",
                p.opts.name,
                self.gate.size()
            )));
        }
        let (prev, last) = (&run.ends.previous, &run.ends.last);
        let at = run.data_offset;
        let old = segment_view(
            prev,
            lower.clone(),
            at,
            size,
            prev.iv_tweak,
            keys.old.as_ref(),
            &p.opts,
        )
        .map_err(failure)?;
        let new = segment_view(
            last,
            lower,
            at,
            size,
            last.iv_tweak,
            keys.new.as_ref(),
            &p.opts,
        )
        .map_err(failure)?;
        drop(keys);
        let dev = Arc::new(Reencrypting {
            name: p.opts.name.clone(),
            size,
            block: self
                .gate
                .logical_block_size()
                .max(new.logical_block_size())
                .max(old.logical_block_size()),
            read_only: false,
            forward: run.ends.forward,
            new,
            old: RwLock::new(Some(old)),
            // Nothing rewritten until the loop starts and says where the boundary is.
            zone: Mutex::new(Zone {
                boundary: if run.ends.forward { 0 } else { size },
                ..Zone::default()
            }),
            moved: Condvar::new(),
        });
        // A hotzone left in reencryption by a crash is recovered before the loop starts:
        // nothing is served meanwhile. Otherwise the old device serves until the new one,
        // with the boundary read from the header, replaces it.
        let held = st.hot.is_some().then(|| self.gate.hold());
        let installer = Installer {
            dev: dev.clone(),
            gate: &self.gate,
            installed: AtomicBool::new(false),
        };
        {
            let mut j = self.job();
            j.size = size;
            j.device = Some(dev.clone());
        }
        let opts = RunOptions {
            max_hotzone: Some(max_hotzone.unwrap_or(ONLINE_HOTZONE)),
            io_block,
            device_size: None,
        };
        let r = run.run_gated(&installer, &opts, &mut |pr: Progress| {
            self.done.store(pr.done, Ordering::SeqCst);
            progress(pr.done, pr.size);
            !self.stop.load(Ordering::SeqCst)
        });
        if !installer.installed.load(Ordering::SeqCst) {
            if let Some(Some(d)) = held {
                self.gate.replace(d);
            }
            self.job().device = None;
        } else if r.is_err() {
            dev.fail();
        }
        r.map_err(failure)
    }

    /// Stop a running reencryption at its next hotzone boundary and wait for it.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        let mut j = self.job();
        while j.running {
            j = self.ended.wait(j).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// What `status` shows.
    pub fn status(&self) -> Option<serde_json::Value> {
        let j = self.job();
        let dev = j.device.as_ref()?;
        let done = dev.done().max(self.done.load(Ordering::SeqCst)).min(j.size);
        Some(serde_json::json!({
            "running": j.running,
            "finished": j.finished,
            "done": done,
            "size": j.size,
            "percent": if j.size > 0 { (done as f64 * 1000.0 / j.size as f64).round() / 10.0 } else { 100.0 },
        }))
    }
}

/// The largest online hotzone unless `--hotzone-size` says otherwise: requests touching it
/// wait while it is rewritten, so it stays small.
pub const ONLINE_HOTZONE: u64 = 4 << 20;

/// Puts the reencrypting device in the gate when the loop starts, then passes the hotzones on.
struct Installer<'a> {
    dev: Arc<Reencrypting>,
    gate: &'a Gate,
    installed: AtomicBool,
}

impl Hotzones for Installer<'_> {
    fn start(&self, boundary: u64) {
        self.dev.start(boundary);
        // Waits for the requests in flight on the old device, then lets held ones through.
        self.gate.replace(self.dev.clone());
        self.installed.store(true, Ordering::SeqCst);
    }
    fn enter(&self, offset: u64, len: u64) {
        self.dev.enter(offset, len);
    }
    fn leave(&self, boundary: u64) {
        self.dev.leave(boundary);
    }
}

/// A volume opened in the middle of a reencryption: served through a gate so that an online
/// reencryption can take it over; resize, suspend and refresh are refused.
struct InReencryption {
    reenc: Reencryptor,
}

/// Serve `device` (the segment map of a volume in reencryption) so that its server can resume
/// the reencryption online.
pub(super) fn serve_in_reencryption(
    device: Arc<dyn BlockDevice>,
    place: Place,
) -> (Arc<dyn BlockDevice>, Arc<dyn Online>) {
    let gate = Arc::new(Gate::new(device));
    let online = Arc::new(InReencryption {
        reenc: Reencryptor::new(place, gate.clone()),
    });
    (gate, online)
}

impl Online for InReencryption {
    fn resize(&self, _: Option<u64>) -> Result<u64, OnlineError> {
        Err(self.busy("resize"))
    }
    fn suspend(&self) -> Result<(), OnlineError> {
        Err(self.busy("suspend"))
    }
    fn resume(&self, _: &Unlock) -> Result<(), OnlineError> {
        Err(OnlineError::invalid(format!(
            "Volume {} is not suspended.",
            self.reenc.place.opts.name
        )))
    }
    fn refresh(
        &self,
        _: &Unlock,
        _: crate::block::online::RefreshFlags,
    ) -> Result<(), OnlineError> {
        Err(self.busy("refresh"))
    }
    fn suspended(&self) -> bool {
        false
    }
    fn allow_discards(&self) -> bool {
        self.reenc.place.opts.allow_discards
    }
    fn closing(&self) {
        self.reenc.stop();
        self.reenc.gate.close();
    }
    fn reencrypt(
        &self,
        unlock: &Unlock,
        max_hotzone: Option<u64>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<(), OnlineError> {
        self.reenc.run(unlock, max_hotzone, progress)
    }
    fn reencryption(&self) -> Option<serde_json::Value> {
        self.reenc.status()
    }
}

impl InReencryption {
    fn busy(&self, what: &str) -> OnlineError {
        OnlineError {
            code: 5,
            message: format!(
                "Device {} is in LUKS2 reencryption; {what} is not supported until it finishes and the device is opened again.",
                self.reenc.place.opts.name
            ),
        }
    }
}
