//! `luks open --readonly URL NAME` and `luks dump URL` (issue 28): a LUKS volume whose device
//! is an `https://`, `http://` or `s3://` object, read through the remote transport
//! ([`crate::crypt::luks::remote::RemoteLuks`]). No disk cache: without verity nothing checks a
//! ciphertext block, so it only ever sits in memory.

use super::device::ServeArgs;
use super::passphrase::{passphrase, KeyArgs};
use super::remote::{location, remote_error, RemoteArgs};
use super::{CliError, CliResult};
use crate::crypt::luks::remote::RemoteLuks;
use crate::crypt::luks::ActivateParams;
use crate::remote::device::RemoteDevice;
use crate::remote::direct::DirectDevice;
use crate::remote::Location;
use serde_json::Value;
use std::path::Path;
use std::sync::Arc;

/// `device` as a remote location, or `None` for a local device.
pub(super) fn remote(device: &Path) -> Result<Option<Location>, CliError> {
    let loc = location(device)?;
    Ok(loc.is_remote().then_some(loc))
}

/// The object at `loc` as a device, and its header.
fn load(
    loc: &Location,
    remote: &RemoteArgs,
    want: Option<u16>,
) -> Result<(RemoteLuks, Arc<RemoteDevice>), CliError> {
    if remote.cache_requested() {
        return Err(CliError::invalid(format!(
            "{loc}: --cache-dir, --cache-size and --prefetch need a verity tree to check blocks \
             against: a remote LUKS volume is never cached on disk"
        )));
    }
    let obj = remote.objects().open(loc).map_err(remote_error)?;
    let dev = Arc::new(RemoteDevice::new(obj.clone(), remote.device()));
    let mut v = RemoteLuks::open(Arc::new(DirectDevice::new(obj)), dev.clone(), want)?;
    if let Some(w) = v.take_warning() {
        eprintln!("dmkit: {w}");
    }
    Ok((v, dev))
}

/// What `luks open` asks of a remote volume.
pub(super) struct OpenRemote<'a> {
    /// The device's location.
    pub loc: Location,
    /// The served name (`None` with --test-passphrase).
    pub name: Option<String>,
    /// `--readonly`.
    pub read_only: bool,
    /// `--key-slot`.
    pub key_slot: Option<u32>,
    /// The LUKS version asked for.
    pub want: Option<u16>,
    /// Where the passphrase comes from.
    pub key: &'a KeyArgs,
    /// How the volume is served.
    pub serve: &'a ServeArgs,
    /// The transport's options.
    pub remote: &'a RemoteArgs,
}

/// `luks open` of a remote device.
pub(super) fn open(o: OpenRemote<'_>) -> CliResult {
    let serving = match &o.name {
        None => None,
        Some(n) if o.read_only => Some((n.clone(), o.serve.prepare(n)?)),
        Some(_) => {
            return Err(CliError::invalid(format!(
                "{}: a remote LUKS volume opens only with --readonly",
                o.loc
            )))
        }
    };
    let (v, dev) = load(&o.loc, o.remote, o.want)?;
    let prompt = format!("Enter passphrase for {}: ", o.loc);
    let pass = passphrase(o.key, &prompt, false)?;
    let Some((name, how)) = serving else {
        let slot = v.test_passphrase(&pass, o.key_slot)?;
        println!("Key slot {slot} unlocked.");
        return Ok(());
    };
    let params = ActivateParams {
        name,
        read_only: true,
        ..ActivateParams::default()
    };
    let mut active = v.activate(&pass, o.key_slot, &params)?;
    drop(pass);
    let crypt_stats = active.stats.take();
    active.stats = Some(Arc::new(move || {
        let mut j = crypt_stats.as_ref().map_or(Value::Null, |f| f());
        if !j.is_object() {
            j = serde_json::json!({});
        }
        let s = dev.source().stats();
        j["remote_requests"] = s.requests.into();
        j["remote_bytes_fetched"] = s.bytes_fetched.into();
        j["remote_retries"] = s.retries.into();
        j
    }));
    o.serve.serve(active, how)
}

/// `luks dump` of a remote device (header only: no volume key over this path).
pub(super) fn dump(loc: &Location, remote: &RemoteArgs, json: bool) -> CliResult {
    let (v, _) = load(loc, remote, None)?;
    super::luks_dump::print_dump(json, || v.dump_json(), || v.dump_text())
}
