//! Throughput of the LUKS2 integrity stack on memory, one thread, against the sealing alone.
use dmkit::block::{BlockDevice, MemoryDevice, TaggedBlockDevice};
use dmkit::crypt::cipher::{AeadKind, SectorAead};
use dmkit::crypt::luks2::integrity::{format, plan, FormatTarget};
use dmkit::crypt::target::AeadCryptDevice;
use dmkit::integrity::{IntegrityDevice, IntegrityOptions, Mode};
use std::sync::Arc;
use std::time::Instant;

fn main() {
    let ss: u32 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(512);
    let size = 600usize << 20;
    let kind = AeadKind::from_luks2("aes-xts-plain64", "hmac(sha256)").unwrap();
    let vk: Vec<u8> = (0..96u8).collect();
    let mem = Arc::new(MemoryDevice::new("m", size));
    let p = plan(kind, ss, size as u64, 0).unwrap();
    format(
        FormatTarget {
            dev: &*mem,
            direct: None,
        },
        0,
        &p,
        kind,
        &vk,
        false,
        &mut |_, _| {},
    )
    .unwrap();
    for mode in [Mode::Journal, Mode::Direct] {
        let i: Arc<dyn TaggedBlockDevice> = Arc::new(
            IntegrityDevice::open(mem.clone(), IntegrityOptions::external_tags("i", mode)).unwrap(),
        );
        let d = AeadCryptDevice::new(
            "c",
            i,
            SectorAead::new(kind, &vk, ss as usize).unwrap(),
            false,
        )
        .unwrap();
        let n = 256usize << 20;
        for bs in [4096usize, 1 << 20] {
            let buf = vec![7u8; bs];
            let t = Instant::now();
            let mut off = 0;
            while off < n {
                d.write_at(&buf, off as u64).unwrap();
                off += bs;
            }
            d.flush().unwrap();
            let w = n as f64 / t.elapsed().as_secs_f64() / 1e6;
            let mut rb = vec![0u8; bs];
            let t = Instant::now();
            let mut off = 0;
            while off < n {
                d.read_at(&mut rb, off as u64).unwrap();
                off += bs;
            }
            let r = n as f64 / t.elapsed().as_secs_f64() / 1e6;
            println!("{mode:?} ss {ss} bs {bs}: write {w:.0} MB/s read {r:.0} MB/s");
        }
    }
    let a = SectorAead::new(kind, &vk, ss as usize).unwrap();
    let mut data = vec![0u8; 1 << 20];
    let mut tags = vec![0u8; (1 << 20) / ss as usize * 32];
    let t = Instant::now();
    for k in 0..256u64 {
        a.seal_sectors(k * 2048, &mut data, &mut tags, 32).unwrap();
    }
    println!(
        "seal alone: {:.0} MB/s",
        256.0 * 1048576.0 / t.elapsed().as_secs_f64() / 1e6
    );
    let t = Instant::now();
    for _ in 0..256u64 {
        a.seal_sectors(0, &mut data, &mut tags, 32).unwrap();
        let _ = a.open_sectors(0, &mut data, &tags, 32).unwrap();
    }
    println!(
        "seal+open: {:.0} MB/s",
        256.0 * 1048576.0 / t.elapsed().as_secs_f64() / 1e6
    );
}
