//! Online reencryption: a served LUKS2 volume whose header is in reencryption is re-keyed (or,
//! with a detached header, decrypted) by its server in the background, hotzone by hotzone,
//! with the offline engine's commit order and metadata (so `reencrypt --resume-only` of dmkit
//! or cryptsetup continues what a close or a crash left). Requests go through
//! [`Reencrypting`]: the part on the rewritten side of the boundary with the new key (or
//! plaintext), the rest with the old one; a request touching the hotzone waits until it is
//! committed, the others go on. No request sees a mix: the boundary only moves over the
//! hotzone, and only while no request touches it. A re-key walks forward (new data below the
//! boundary), a decryption backward (new data above it), as cryptsetup 2.6 walks them. A
//! decryption of a device whose header was at its start walks forward with its data moving
//! down ([`Layout::Moved`]): the served device keeps every byte at its logical offset while
//! the segment map under it changes hotzone by hotzone.

use super::reencrypting::{Layout, OldViews, Reencrypting};
use super::LuksError;
use super::LuksVolume;
use crate::block::online::{Gate, Online, OnlineError, Unlock};
use crate::block::BlockDevice;
use crate::crypt::luks2::activate::ActivateOptions;
use crate::crypt::luks2::reencrypt::decrypt_shift::{self, is_moved_decryption};
use crate::crypt::luks2::reencrypt::{
    engine, Hotzones, Progress, ReencryptState, RunOptions, RunOutcome,
};
use crate::crypt::luks2::reencrypt_open::segment_view;
use crate::crypt::luks2::Luks2Header;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

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
    /// The file the header at the device's start was exported to while it was served (see
    /// [`Reencryptor::adopt`]): the header from then on.
    exported: Mutex<Option<PathBuf>>,
    /// The device's first bytes, data once the header moved out, claimed as the rest of the
    /// data is by the server (see [`Reencryptor::adopt`]).
    head: Mutex<Option<crate::block::Claim>>,
    gate: Arc<Gate>,
    job: Mutex<Job>,
    ended: Condvar,
    stop: AtomicBool,
    done: AtomicU64,
    /// The data moved but nothing serves it: why, and what the user can do (see
    /// [`Reencryptor::fail_unserved`]).
    unserved: Mutex<Option<String>>,
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
            exported: Mutex::new(None),
            head: Mutex::new(None),
            gate,
            job: Mutex::new(Job::default()),
            ended: Condvar::new(),
            stop: AtomicBool::new(false),
            done: AtomicU64::new(0),
            unserved: Mutex::new(None),
        }
    }

    fn job(&self) -> MutexGuard<'_, Job> {
        self.job.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn exported(&self) -> MutexGuard<'_, Option<PathBuf>> {
        self.exported.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The volume's header file now: the detached one it was opened with, or the one its
    /// header was exported to; `None` while the header is at the device's start.
    fn header(&self) -> Option<PathBuf> {
        self.place
            .header
            .clone()
            .or_else(|| self.exported().clone())
    }

    /// Take `header` as the volume's header from now on: the file the command line exported
    /// the header at the device's start to, having moved the first data segment to the
    /// device's start while the device was `suspended` (a decryption moving the data down,
    /// cryptsetup's `reencrypt --decrypt --header NEWFILE` of an active device). The served
    /// mapping is stale from then on: only the reencryption's own, installed when its loop
    /// starts, serves again. Refused unless the volume is served with its header at its start
    /// and suspended, and `header` holds this volume's (`uuid`) header in such a decryption;
    /// the file taken already (or the detached header) is accepted again.
    pub fn adopt(&self, header: &Path, suspended: bool, uuid: &str) -> Result<(), OnlineError> {
        let name = &self.place.opts.name;
        let mut ex = self.exported();
        if let Some(h) = self.place.header.as_ref().or(ex.as_ref()) {
            if same_file(h, header) {
                return Ok(());
            }
            return Err(OnlineError::invalid(format!(
                "{name}: served with the header {}, not {}.",
                h.display(),
                header.display()
            )));
        }
        if !suspended {
            return Err(OnlineError::invalid(format!(
                "{name}: {} is served with its header at its start, not with {}.",
                self.place.device.display(),
                header.display()
            )));
        }
        let vol =
            LuksVolume::open(&self.place.device, Some(header), false, None).map_err(failure)?;
        if vol.uuid() != uuid {
            return Err(OnlineError::invalid(format!(
                "{}: the header of volume {}, not of {name} ({uuid}).",
                header.display(),
                vol.uuid()
            )));
        }
        let st = vol.reencryption().map_err(failure)?;
        let Some(st) = st.filter(is_moved_decryption) else {
            return Err(OnlineError::invalid(format!(
                "{}: not in a LUKS2 decryption moving the data down.",
                header.display()
            )));
        };
        // The header's place is data now: claimed, so that nothing else maps it meanwhile.
        let dev = &self.place.device;
        let claim = crate::block::open_device(dev, false, false)
            .map_err(|e| e.to_string())
            .and_then(|d| {
                crate::block::Claim::take(d.file(), dev, 0, st.keyslot.shift, true)
                    .map_err(|e| e.to_string())
            })
            .map_err(|e| {
                OnlineError::invalid(format!("{}: cannot claim its start: {e}", dev.display()))
            })?;
        *self.head.lock().unwrap_or_else(|e| e.into_inner()) = Some(claim);
        *ex = Some(header.to_path_buf());
        Ok(())
    }

    /// After a failed online decryption of a volume served with its header at its start
    /// (its [`Reencryptor::adopt`] or its [`Reencryptor::run`]): when its data moved (the
    /// header exported, its magic wiped from the device's start) and no reencryption map
    /// was ever served, requests are held on the stale map for ever; they fail from now on
    /// with an I/O error naming `why` instead (see [`super::unserved`]), and so does every
    /// later one until a run serves its map (the same command again: its `adopt` accepts
    /// such a device as it accepts a suspended one). Returns `why` with what the user can
    /// do, for the command line; `None` (nothing changed) otherwise.
    pub fn fail_unserved(&self, why: &str, header: &Path) -> Option<String> {
        if self.place.header.is_some() || self.started() {
            return None;
        }
        if !self.gate.is_held() && !self.unserved() {
            return None;
        }
        let header = self.exported().clone().unwrap_or(header.to_path_buf());
        if !self.data_moved() {
            return None;
        }
        let name = &self.place.opts.name;
        let told = format!(
            "{why} ({name} moved its data for the decryption but does not serve it: it fails every request until `dmkit luks reencrypt --decrypt --header {h} {name}` succeeds, or it is closed and opened with --header {h})",
            h = header.display()
        );
        // Held requests wake up with the error (no request was served by this map).
        self.gate.replace(Arc::new(super::unserved::Unserved::new(
            name,
            self.gate.size(),
            self.gate.logical_block_size(),
            format!("the online decryption failed: {why}"),
        )));
        *self.told() = Some(told.clone());
        Some(told)
    }

    /// Whether the device serves nothing after a failed decryption ([`Reencryptor::fail_unserved`]).
    pub fn unserved(&self) -> bool {
        self.told().is_some()
    }

    /// Why the device serves nothing, with what the user can do (`None` while it serves).
    fn told(&self) -> MutexGuard<'_, Option<String>> {
        self.unserved.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the volume's data moved for a decryption: its header was taken from a file
    /// ([`Reencryptor::adopt`]), or the device's start holds no LUKS header any more (the
    /// export wipes its magic before it moves any data).
    fn data_moved(&self) -> bool {
        self.exported().is_some()
            || matches!(
                LuksVolume::open(&self.place.device, None, false, None),
                Err(LuksError::NotLuks { .. })
            )
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
        let header = self.header();
        let mut vol =
            LuksVolume::open(&p.device, header.as_deref(), true, None).map_err(failure)?;
        let st = vol
            .reencryption()
            .map_err(failure)?
            .ok_or_else(|| OnlineError::invalid("Device reencryption not in progress."))?;
        let data = match &header {
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
        if is_moved_decryption(&st) {
            let devs = (hdr_dev, data_dev, lower);
            let r = self.run_moved(devs, h, &st, &keys, progress);
            drop(keys);
            return r;
        }
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
        let layout = match run.ends.forward {
            true => Layout::Forward,
            false => Layout::Backward,
        };
        let dev = self.reencrypting(layout, size, new, OldViews { old, moved: None });
        let opts = RunOptions {
            max_hotzone: Some(max_hotzone.unwrap_or(ONLINE_HOTZONE)),
            io_block,
            device_size: None,
        };
        self.serve(dev, st.hot.is_some(), progress, |hooks, pr| {
            run.run_gated(hooks, &opts, pr)
        })
    }

    /// The device served during a run of `layout` over `size` bytes, nothing rewritten until
    /// the loop starts and says where the boundary is.
    fn reencrypting(
        &self,
        layout: Layout,
        size: u64,
        new: Arc<dyn BlockDevice>,
        old: OldViews,
    ) -> Arc<Reencrypting> {
        let block = [Some(&new), Some(&old.old), old.moved.as_ref()]
            .into_iter()
            .flatten()
            .map(|d| d.logical_block_size())
            .fold(self.gate.logical_block_size(), u32::max);
        Arc::new(Reencrypting::new(
            &self.place.opts.name,
            size,
            block,
            layout,
            new,
            old,
        ))
    }

    /// Run `go` with `dev` served from the loop's start on. A hotzone left in reencryption by
    /// a crash (`recovering`) is recovered before the loop starts: nothing is served
    /// meanwhile. Otherwise the old device serves until the new one, with the boundary read
    /// from the header, replaces it.
    fn serve(
        &self,
        dev: Arc<Reencrypting>,
        recovering: bool,
        progress: &mut dyn FnMut(u64, u64),
        go: impl FnOnce(
            &dyn Hotzones,
            &mut dyn FnMut(Progress) -> bool,
        ) -> Result<RunOutcome, LuksError>,
    ) -> Result<RunOutcome, OnlineError> {
        let held = recovering.then(|| self.gate.hold());
        let installer = Installer {
            dev: dev.clone(),
            gate: &self.gate,
            installed: AtomicBool::new(false),
        };
        {
            let mut j = self.job();
            j.size = dev.size();
            j.device = Some(dev.clone());
        }
        let r = go(&installer, &mut |pr: Progress| {
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

    /// Run the decryption moving the data down (`decrypt_shift`) whose header `h` is in
    /// `st`: the moved first segment and the old data served with the old key, the plaintext
    /// at its new place linear, all over `lower` (the data device).
    fn run_moved(
        &self,
        (hdr_dev, data_dev, lower): (&dyn BlockDevice, &dyn BlockDevice, Arc<dyn BlockDevice>),
        h: &mut Luks2Header,
        st: &ReencryptState,
        keys: &engine::Keys,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<RunOutcome, OnlineError> {
        let p = &self.place;
        let (prev, fin) = (&st.previous, &st.fin);
        let moved = st
            .moved
            .as_ref()
            .ok_or_else(|| OnlineError::invalid("reencryption metadata: no moved segment"))?;
        let shift = st.keyslot.shift;
        let size = match prev.size {
            Some(s) => Some(s),
            None => data_dev.size().checked_sub(fin.offset + shift),
        }
        .filter(|&s| s > 0)
        .ok_or_else(|| {
            OnlineError::invalid(format!("Device {} is too small.", p.device.display()))
        })?;
        let m = moved
            .size
            .filter(|&m| m > 0 && m <= size.min(shift))
            .ok_or_else(|| OnlineError::invalid("reencryption metadata: bad moved segment size"))?;
        if size != self.gate.size() {
            return Err(OnlineError::invalid(format!(
                "{}: {} bytes are served but the decryption covers {size}; resize is not supported during reencryption",
                p.opts.name,
                self.gate.size()
            )));
        }
        let old_key = keys.old.as_ref();
        let view = |seg, at, len, iv, key| {
            segment_view(seg, lower.clone(), at, len, iv, key, &p.opts).map_err(failure)
        };
        let old = OldViews {
            old: view(prev, prev.offset, size, prev.iv_tweak, old_key)?,
            moved: Some(view(moved, moved.offset, m, moved.iv_tweak, old_key)?),
        };
        let new = view(fin, fin.offset, size, 0, None)?;
        let dev = self.reencrypting(Layout::Moved(m), size, new, old);
        self.serve(dev, st.hot.is_some(), progress, |hooks, pr| {
            decrypt_shift::run(hdr_dev, data_dev, h, keys, pr, Some(hooks))
        })
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
        let Some(dev) = j.device.as_ref() else {
            // A decryption that moved the data and failed before serving its map: every
            // request fails, and `status` says why rather than look like a healthy device.
            return self.told().as_ref().map(|why| {
                serde_json::json!({
                    "running": j.running,
                    "finished": false,
                    "unserved": why,
                    "exported_header": self.exported().as_deref().map(|p| p.display().to_string()),
                })
            });
        };
        let done = dev.done().max(self.done.load(Ordering::SeqCst)).min(j.size);
        Some(serde_json::json!({
            "running": j.running,
            "finished": j.finished,
            "done": done,
            "size": j.size,
            "percent": if j.size > 0 { (done as f64 * 1000.0 / j.size as f64).round() / 10.0 } else { 100.0 },
            // The header the device's was exported to while served (the status's `header`
            // is the one it was opened with).
            "exported_header": self.exported().as_deref().map(|p| p.display().to_string()),
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
        header: Option<&Path>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<(), OnlineError> {
        if let Some(h) = header {
            // Opened with its header file: `adopt` accepts that file only.
            self.reenc.adopt(h, false, "")?;
        }
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

/// Whether `x` and `y` name the same file.
fn same_file(x: &Path, y: &Path) -> bool {
    std::fs::canonicalize(x)
        .ok()
        .zip(std::fs::canonicalize(y).ok())
        .is_some_and(|(x, y)| x == y)
}
