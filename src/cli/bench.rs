//! `dmkit bench`: fio through our exports (`plain` vs `verity`, ...) and `bench format`
//! (`veritysetup format` vs `dmkit verity format`). The logic lives in [`crate::bench`].
use std::path::PathBuf;

use super::{CliError, CliResult};
use crate::bench::harness::fio::Workload;
use crate::bench::harness::process::Interrupt;
use crate::bench::harness::report;
use crate::bench::harness::rw::RwBenchOptions;
use crate::bench::scenarios::config::Config;
use crate::bench::scenarios::format::FormatOptions;
use crate::bench::scenarios::overhead::OverheadOptions;
use crate::bench::{self, BenchError};

/// Arguments of `dmkit bench`.
#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchArgs {
    #[command(subcommand)]
    command: Option<BenchCommand>,
    #[command(flatten)]
    overhead: OverheadArgs,
}

/// `dmkit bench` subcommands.
#[derive(clap::Subcommand)]
enum BenchCommand {
    /// Time `veritysetup format` against `dmkit verity format` on the same data.
    Format(FormatArgs),
    /// Our AES-XTS throughput (4 KiB sectors) next to `openssl speed -evp aes-256-xts`, then AES-CBC, serpent, twofish and AES-LRW.
    Cipher(CipherArgs),
    /// Cloudflare's dm-crypt study ("Speeding up Linux disk encryption", 2020): plain vs crypt on a RAM-backed file against the cipher bound;
    /// with `--peer qemu-storage-daemon`, our crypt export vs QEMU's LUKS FUSE export.
    Crypt(CryptArgs),
    /// The dm-integrity overhead table (4 KiB write, randwrite, read, randread, buffered and
    /// direct): plain against integrity in J, B and D modes, LUKS2 crypt+integrity and
    /// integrity with hmac-sha256 tags, each on its own file in RAM, beside the arithmetic alone.
    Integrity(RwArgs),
    /// dm-verity against dm-integrity (sha256, hmac-sha256) as read paths: throughput and CPU
    /// per GB, beside the Mitsubishi Electric paper's ratios.
    VerityIntegrity(RwArgs),
    /// fs-verity reads through `fsverity mount` with and without verification (SEEDS.md seed
    /// 002): 4 KiB buffered read and randread of a 1 MiB file and of a --size file.
    Fsverity(RwArgs),
    /// `fsverity digest` against `dmkit fsverity digest` on a large file and on many small
    /// files (same data, same run, identical output checked).
    FsverityDigest(FsvDigestArgs),
    /// Read-only root images (seed 001): one tree built as ext4, SquashFS and EROFS with each
    /// compression of the document's table; size as % of ext4 and the cold-cache time to read
    /// the whole tree through `dmkit image open`, beside the document's figures.
    Image(ImageArgs),
    /// dmkit's NBD export (linear, Unix socket) against qemu-storage-daemon's NBD export of the
    /// same file, fio's nbd engine on both: 4k qd32 randread and 1M read (target 1.5x), writes,
    /// and each server's CPU per request.
    Nbd(RwArgs),
    /// The export as a dimension: dmkit linear through FUSE (/dev/fuse), FUSE over io_uring and
    /// NBD against the kernel loop on the raw file and qemu-storage-daemon's FUSE and NBD
    /// exports, same run: 1M read/write qd4, 4k randread qd32/qd1, 4k randwrite qd32, loop
    /// devices with direct I/O on the FUSE files, each server's CPU per request. Needs root.
    Export(RwArgs),
    /// Offline LUKS2 re-keying: `cryptsetup reencrypt --force-offline-reencrypt` against
    /// `dmkit luks reencrypt` per resilience mode, in RAM and on disk, beside the AES-XTS bound.
    Reencrypt(ReencryptBenchArgs),
    /// Every table of the source documents (seeds 000 to 004) in one run: each document's
    /// scenario as a section, dmkit's figure beside a baseline measured in the same run and the
    /// document's own figure and ratio; `--out DIR` writes report.md, report.json and plots.
    Seeds(SeedsArgs),
    /// dm-verity FEC: reads of an image with scattered corrupted blocks against the clean
    /// image through `dmkit verity open --fec-device`, and the time of `verity repair`.
    Fec(FecBenchArgs),
    /// Images without root: cold read of the whole tree through `dmkit image open` as nobody
    /// (dmkit's FUSE server, each overlay mode) against the kernel mount as root, and
    /// `image mtree` against hashing the kernel mount (dmkit's walk and sha256sum), per file
    /// system. Needs root, loop devices, FUSE and the user nobody.
    Rootless(RootlessArgs),
    /// Read (or hash) every file of a tree and print the counts and seconds as JSON: what
    /// `bench rootless` runs as root or as nobody.
    #[command(hide = true)]
    ReadTree(ReadTreeArgs),
    /// A verity image read over HTTP from 127.0.0.1 with 0 and 20 ms (or `--delays`) added per
    /// request: dmkit's remote verity export (verified) against dmkit's remote device served
    /// raw, nbdkit's curl plugin and QEMU's curl driver (unverified), 4 KiB and 64 KiB random
    /// reads, a sequential read, time to a first read.
    Remote(RemoteBenchArgs),
    /// Serve a remote object raw (unverified) over NBD on a Unix socket, in the foreground
    /// until killed: `bench remote`'s unverified dmkit reader.
    #[command(hide = true)]
    ServeRemote(ServeRemoteArgs),
}

/// Arguments of `dmkit bench serve-remote`.
#[derive(clap::Args)]
struct ServeRemoteArgs {
    /// The object's URL.
    url: String,
    /// The Unix socket to serve it on.
    socket: PathBuf,
}

/// Arguments of `dmkit bench rootless`.
#[derive(clap::Args)]
struct RootlessArgs {
    /// File systems, each built with `image build`'s default compression.
    #[arg(long, value_delimiter = ',', default_value = "squashfs,erofs,ext4")]
    fs: Vec<String>,
    #[command(flatten)]
    common: TreeBenchArgs,
}

/// Arguments of `dmkit bench read-tree`.
#[derive(clap::Args)]
struct ReadTreeArgs {
    /// The directory to read.
    root: PathBuf,
    /// Hash every regular file with SHA-256 (and list the digests).
    #[arg(long)]
    sha256: bool,
}

/// Arguments of `dmkit bench remote`.
#[derive(clap::Args)]
struct RemoteBenchArgs {
    /// Bytes of data in the image [default: 256M, --quick: 32M].
    #[arg(long)]
    size: Option<String>,
    /// Runs per job, delay and reader [default: 2, --quick: 1].
    #[arg(long)]
    runs: Option<u32>,
    /// Seconds per fio run [default: 5, --quick: 1.5].
    #[arg(long)]
    runtime: Option<f64>,
    /// Delays added to each HTTP request, ms. QEMU 7.2's curl driver is not run at 0 ms: it
    /// hangs under fio at queue depth 8 when the server answers at once (against nginx too).
    #[arg(long, value_delimiter = ',', default_value = "0,20")]
    delays: Vec<u64>,
    /// Directory for the scratch files (RAM by default).
    #[arg(long, default_value = "/dev/shm")]
    dir: PathBuf,
    /// Small and fast.
    #[arg(long)]
    quick: bool,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

/// Arguments of `dmkit bench seeds`.
#[derive(clap::Args)]
struct SeedsArgs {
    /// Smaller and shorter (256 MiB per side, one run of 2 s per job and side, a small tree
    /// for the images).
    #[arg(long)]
    quick: bool,
    /// Only these documents, e.g. 000,002.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Write report.md, report.json and the plots (SVG and PNG) into this directory.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Runs per job and side [default: 3, --quick: 1].
    #[arg(long)]
    runs: Option<u32>,
    /// Directory for the scratch files (RAM, as in the studies).
    #[arg(long, default_value = "/dev/shm")]
    dir: PathBuf,
    /// The tree seed 001's images are built from [default: bench image's].
    #[arg(long)]
    tree: Option<PathBuf>,
    /// Tiny sizes, a smoke run of seconds (tests; also DMKIT_BENCH_SEEDS_TINY=1).
    #[arg(long, hide = true)]
    tiny: bool,
    /// Print the whole result model as JSON instead of the tables.
    #[arg(long)]
    json: bool,
}

/// Arguments of `dmkit bench fec`.
#[derive(clap::Args)]
struct FecBenchArgs {
    /// Parity bytes per codeword (2 to 24).
    #[arg(long, default_value_t = crate::verity::fec::DEFAULT_ROOTS)]
    fec_roots: u8,
    /// Corrupted data blocks, scattered within the bound [default: 1000, --quick: 64].
    #[arg(long)]
    damaged: Option<u64>,
    #[command(flatten)]
    rw: RwArgs,
}

/// Arguments of `dmkit bench reencrypt`.
#[derive(clap::Args)]
struct ReencryptBenchArgs {
    /// Bytes of data (after the 16 MiB header).
    #[arg(long, default_value = "1G")]
    size: String,
    /// Directories to run in, one table row group each (a scratch directory is made inside):
    /// RAM and a disk directory by default.
    #[arg(long, value_delimiter = ',', default_values = ["/dev/shm", "/var/tmp"])]
    dir: Vec<PathBuf>,
    /// Runs per tool, mode and directory (the median is reported).
    #[arg(long, default_value_t = 3)]
    runs: u32,
    /// Resilience modes given to both tools: checksum, journal, none.
    #[arg(long, value_delimiter = ',', default_value = "checksum,journal")]
    resilience: Vec<String>,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

/// Arguments of `dmkit bench fsverity-digest`.
#[derive(clap::Args)]
struct FsvDigestArgs {
    /// Size of the large file; 0 to skip it [default: 2G, --quick: 64M].
    #[arg(long)]
    size: Option<String>,
    /// Number of small files; 0 to skip them [default: 10000, --quick: 500].
    #[arg(long)]
    files: Option<u32>,
    /// Largest small file; their sizes are uniform from 0 to this unless --mean-file-size.
    #[arg(long, default_value = "64K")]
    max_file_size: String,
    /// Draw the small files' sizes from an exponential distribution with this mean (capped
    /// at --max-file-size) instead: mostly tiny files.
    #[arg(long)]
    mean_file_size: Option<String>,
    /// Seed of the small files' sizes.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Runs per tool and case (the median is reported) [default: 5, --quick: 1].
    #[arg(long)]
    runs: Option<u32>,
    /// Hash algorithm given to both tools: sha256 or sha512.
    #[arg(long, default_value = "sha256")]
    hash_alg: String,
    /// Directory for the scratch files (a temporary directory is made inside and removed
    /// afterwards).
    #[arg(long, default_value = "/var/tmp")]
    dir: PathBuf,
    /// Small and fast (a smoke run).
    #[arg(long)]
    quick: bool,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

/// The arguments `bench image` and `bench rootless` share: the tree, the runs, where.
#[derive(clap::Args)]
struct TreeBenchArgs {
    /// The tree to build [default: a minimal Debian root made once with debootstrap and cached
    /// under --cache, else /usr].
    #[arg(long)]
    tree: Option<PathBuf>,
    /// Cold-cache runs per measurement [default: 3, --quick: 1].
    #[arg(long)]
    runs: Option<u32>,
    /// Directory for the images and the mount points (a temporary directory is made inside).
    #[arg(long, default_value = "/var/tmp")]
    dir: PathBuf,
    /// Where the default tree is cached.
    #[arg(long, default_value = "/var/tmp")]
    cache: PathBuf,
    /// Small and fast: the tree's usr/bin only, one run.
    #[arg(long)]
    quick: bool,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

impl TreeBenchArgs {
    /// The options these arguments give: `--quick`'s defaults, then what was given.
    fn options(self) -> crate::bench::scenarios::image_tree::TreeBenchOptions {
        use std::io::IsTerminal;
        let mut o = crate::bench::scenarios::image_tree::TreeBenchOptions::defaults(self.quick);
        o.progress = std::io::stderr().is_terminal();
        o.tree = self.tree;
        if let Some(r) = self.runs {
            o.runs = r;
        }
        o.dir = self.dir;
        o.cache = self.cache;
        o
    }
}

/// Arguments of `dmkit bench image`.
#[derive(clap::Args)]
struct ImageArgs {
    /// The document's rows to run, e.g. 2,4,10 [default: all 14; row 2 is always run].
    #[arg(long, value_delimiter = ',')]
    rows: Vec<u32>,
    #[command(flatten)]
    common: TreeBenchArgs,
}

/// Arguments of `dmkit bench cipher`.
#[derive(clap::Args)]
struct CipherArgs {
    /// Seconds per measurement.
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

/// Arguments shared by the read-write benchmarks (`bench crypt`, `bench integrity`).
#[derive(clap::Args)]
struct RwArgs {
    /// Runs per job and side [default: 3 (bench export: 2, bench fsverity: 5), --quick: 1].
    #[arg(long)]
    runs: Option<u32>,
    /// Size of each side's data [default: 1G, --quick: 256M].
    #[arg(long)]
    size: Option<String>,
    /// Seconds per fio run [default: 5, --quick: 2].
    #[arg(long)]
    runtime: Option<f64>,
    /// Directory for the scratch files, in RAM as in the studies (a disk directory for the disk case).
    #[arg(long, default_value = "/dev/shm")]
    dir: PathBuf,
    /// Small and fast.
    #[arg(long)]
    quick: bool,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

impl RwArgs {
    fn options(&self, command: &str) -> Result<RwBenchOptions, CliError> {
        self.options_with_runs(command, None)
    }

    /// [`RwArgs::options`] for a command whose full run takes `runs` runs by default.
    fn options_with_runs(
        &self,
        command: &str,
        runs: Option<u32>,
    ) -> Result<RwBenchOptions, CliError> {
        use std::io::IsTerminal;
        let mut o = RwBenchOptions::defaults(self.quick);
        if let (Some(r), false) = (runs, self.quick) {
            o.runs = r;
        }
        o.progress = std::io::stderr().is_terminal();
        if let Some(r) = self.runs {
            o.runs = r;
        }
        if let Some(s) = &self.size {
            o.size = bench::parse_size(s).map_err(cli_error)?;
        }
        if let Some(ms) = runtime_ms(self.runtime, command)? {
            o.runtime_ms = ms;
        }
        o.dir = self.dir.clone();
        Ok(o)
    }
}

/// Arguments of `dmkit bench crypt`.
#[derive(clap::Args)]
struct CryptArgs {
    /// Compare against another implementation instead: `qemu-storage-daemon`.
    #[arg(long)]
    peer: Option<String>,
    #[command(flatten)]
    rw: RwArgs,
}

/// fio through the exports of each configuration (the default `dmkit bench`).
#[derive(clap::Args)]
struct OverheadArgs {
    /// Runs per workload and configuration [default: 5, --quick: 1].
    #[arg(long)]
    runs: Option<u32>,
    /// Size of the random data file [default: 256M, --quick: 64M].
    #[arg(long)]
    size: Option<String>,
    /// Seconds per fio run [default: 4, --quick: 1.5].
    #[arg(long)]
    runtime: Option<f64>,
    /// Directory for the scratch files (a temporary directory is made inside).
    #[arg(long, default_value = "/var/tmp")]
    dir: PathBuf,
    /// Small and fast: 64M, 1 run, 1.5 s per run; still the full table.
    #[arg(long)]
    quick: bool,
    /// Print the whole result model as JSON.
    #[arg(long)]
    json: bool,
    /// Configurations, the baseline first: plain, verity, verity-cold (no data cache), crypt.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "plain,verity,verity-cold,crypt"
    )]
    config: Vec<String>,
    /// Workloads: read, randread, read-direct, randread-direct, seq-1m, rand-4k-qd32,
    /// rand-4k-qd1 [default: all].
    #[arg(long, value_delimiter = ',')]
    workloads: Vec<String>,
}

/// Arguments of `dmkit bench format`.
#[derive(clap::Args)]
struct FormatArgs {
    /// Size of the random data file.
    #[arg(long, default_value = "2G")]
    size: String,
    /// Runs per tool.
    #[arg(long, default_value_t = 3)]
    runs: u32,
    /// Directory for the scratch files (a temporary directory is made inside).
    #[arg(long, default_value = "/var/tmp")]
    dir: PathBuf,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
    /// Verity+FEC rows: `--fec-roots` of each (2 to 24), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "2")]
    fec_roots: Vec<u8>,
    /// No verity+FEC rows.
    #[arg(long, conflicts_with = "fec_roots")]
    no_fec: bool,
}

fn cli_error(e: BenchError) -> CliError {
    match e {
        BenchError::Interrupted => CliError {
            code: 130,
            message: "bench: interrupted (exports closed, scratch files removed)".into(),
        },
        BenchError::Mismatch(m) => CliError::verification(format!("bench: {m}")),
        e => CliError::invalid(format!("bench: {e}")),
    }
}

/// Print a report as JSON (`--json`) or as its text table.
fn print_report<R: report::Report>(json: bool, r: &R) -> CliResult {
    let text = report::output(r, json).map_err(|e| CliError::invalid(format!("bench: {}", e)))?;
    print!("{text}");
    Ok(())
}

/// Run `dmkit bench`.
pub fn run(a: BenchArgs) -> CliResult {
    match a.command {
        Some(BenchCommand::Format(f)) => run_format(f),
        Some(BenchCommand::Cipher(c)) => run_cipher(c),
        Some(BenchCommand::Crypt(c)) => run_crypt(c),
        Some(BenchCommand::Integrity(i)) => run_integrity(i),
        Some(BenchCommand::VerityIntegrity(a)) => run_verity_integrity(a),
        Some(BenchCommand::Fsverity(a)) => run_fsverity_read(a),
        Some(BenchCommand::FsverityDigest(a)) => run_fsverity_digest(a),
        Some(BenchCommand::Image(a)) => run_image(a),
        Some(BenchCommand::Nbd(a)) => run_nbd(a),
        Some(BenchCommand::Export(a)) => run_export(a),
        Some(BenchCommand::Reencrypt(a)) => run_reencrypt(a),
        Some(BenchCommand::Seeds(a)) => run_seeds(a),
        Some(BenchCommand::Fec(a)) => run_fec(a),
        Some(BenchCommand::Rootless(a)) => run_rootless(a),
        Some(BenchCommand::ReadTree(a)) => run_read_tree(a),
        Some(BenchCommand::Remote(a)) => run_remote(a),
        Some(BenchCommand::ServeRemote(a)) => {
            bench::scenarios::remote::raw::serve(&a.url, &a.socket).map_err(CliError::invalid)
        }
        None => run_overhead(a.overhead),
    }
}

fn run_overhead(a: OverheadArgs) -> CliResult {
    let mut o = OverheadOptions::defaults(a.quick);
    if let Some(r) = a.runs {
        o.runs = r;
    }
    if let Some(s) = &a.size {
        o.size = bench::parse_size(s).map_err(cli_error)?;
    }
    if let Some(ms) = runtime_ms(a.runtime, "bench")? {
        o.runtime_ms = ms;
    }
    o.dir = a.dir;
    o.configs = Config::parse_list(&a.config).map_err(cli_error)?;
    if !a.workloads.is_empty() {
        o.workloads = Workload::select(&a.workloads).map_err(cli_error)?;
    }
    let interrupt = Interrupt::install();
    let report = bench::scenarios::overhead::run(&o, &interrupt).map_err(cli_error)?;
    print_report(a.json, &report)
}

fn run_format(a: FormatArgs) -> CliResult {
    let o = FormatOptions {
        size: bench::parse_size(&a.size).map_err(cli_error)?,
        runs: a.runs,
        dir: a.dir,
        fec_roots: if a.no_fec { Vec::new() } else { a.fec_roots },
        ..FormatOptions::default()
    };
    let interrupt = Interrupt::install();
    let report = bench::scenarios::format::run(&o, &interrupt).map_err(cli_error)?;
    print_report(a.json, &report)
}

fn run_cipher(a: CipherArgs) -> CliResult {
    if !(a.seconds.is_finite() && a.seconds > 0.0 && a.seconds <= 600.0) {
        return Err(CliError::invalid(
            "bench cipher: --seconds must be in (0, 600]",
        ));
    }
    let interrupt = Interrupt::install();
    let report = bench::scenarios::cipher::run(a.seconds, &interrupt).map_err(cli_error)?;
    print_report(a.json, &report)
}

fn run_crypt(a: CryptArgs) -> CliResult {
    use crate::bench::scenarios::cloudflare;
    let o = a.rw.options("bench crypt")?;
    let interrupt = Interrupt::install();
    match a.peer.as_deref() {
        None => {
            let r = cloudflare::run_seed(&o, &interrupt).map_err(cli_error)?;
            print_report(a.rw.json, &r)
        }
        Some("qemu-storage-daemon") => {
            let r = cloudflare::run_peer(&o, &interrupt).map_err(cli_error)?;
            print_report(a.rw.json, &r)
        }
        Some(p) => Err(CliError::invalid(format!(
            "bench crypt: --peer {p}: unknown peer (known: qemu-storage-daemon)"
        ))),
    }
}

fn run_integrity(a: RwArgs) -> CliResult {
    use crate::bench::scenarios::integrity;
    let o = a.options("bench integrity")?;
    let interrupt = Interrupt::install();
    let r = integrity::run(&o, &interrupt).map_err(cli_error)?;
    print_report(a.json, &r)
}

fn run_verity_integrity(a: RwArgs) -> CliResult {
    use crate::bench::scenarios::verity_integrity;
    let o = a.options("bench verity-integrity")?;
    let interrupt = Interrupt::install();
    let r = verity_integrity::run(&o, &interrupt).map_err(cli_error)?;
    print_report(a.json, &r)
}

fn run_fsverity_read(a: RwArgs) -> CliResult {
    use crate::bench::scenarios::fsverity_read;
    // Runs take a second or two, and one in a few dips by a fifth on either side (the serving
    // threads share 2 cores with fio): a median of 5 holds where one of 3 moved by 20 points.
    // Some VMs swing the 1 GiB rows by half on both sides, beyond what 5 runs settle: the
    // README says how that looks, and `--json` keeps every run.
    let o = a.options_with_runs("bench fsverity", Some(5))?;
    let interrupt = Interrupt::install();
    let r = fsverity_read::run(&o, &interrupt).map_err(cli_error)?;
    print_report(a.json, &r)
}

fn run_fsverity_digest(a: FsvDigestArgs) -> CliResult {
    use crate::bench::scenarios::fsverity_digest::{self, FsvDigestOptions};
    let mut o = FsvDigestOptions::defaults(a.quick);
    if let Some(s) = &a.size {
        o.size = bench::parse_size(s).map_err(cli_error)?;
    }
    if let Some(n) = a.files {
        o.files = n;
    }
    if let Some(r) = a.runs {
        o.runs = r;
    }
    o.max_file_size = bench::parse_size(&a.max_file_size).map_err(cli_error)?;
    o.mean_file_size = a
        .mean_file_size
        .as_deref()
        .map(bench::parse_size)
        .transpose()
        .map_err(cli_error)?;
    o.seed = a.seed;
    o.hash = a.hash_alg;
    o.dir = a.dir;
    let interrupt = Interrupt::install();
    let r = fsverity_digest::run(&o, &interrupt).map_err(cli_error)?;
    print_report(a.json, &r)
}

fn run_image(a: ImageArgs) -> CliResult {
    use crate::bench::scenarios::image::{self, ImageBenchOptions};
    let json = a.common.json;
    let mut o = ImageBenchOptions {
        common: a.common.options(),
        ..ImageBenchOptions::defaults(false)
    };
    if !a.rows.is_empty() {
        o.rows = a.rows;
    }
    let interrupt = Interrupt::install();
    let r = image::run(&o, &interrupt).map_err(cli_error)?;
    print_report(json, &r)
}

fn run_rootless(a: RootlessArgs) -> CliResult {
    use crate::bench::scenarios::rootless::{self, RootlessBenchOptions};
    let json = a.common.json;
    let o = RootlessBenchOptions {
        common: a.common.options(),
        fs: a.fs,
    };
    let interrupt = Interrupt::install();
    let r = rootless::run(&o, &interrupt).map_err(cli_error)?;
    print_report(json, &r)
}

fn run_read_tree(a: ReadTreeArgs) -> CliResult {
    let r = bench::scenarios::rootless::read_tree_timed(&a.root, a.sha256).map_err(cli_error)?;
    let s = serde_json::to_string(&r).map_err(|e| CliError::invalid(format!("bench: {e}")))?;
    println!("{s}");
    Ok(())
}

fn run_seeds(a: SeedsArgs) -> CliResult {
    use crate::bench::seeds::{self, SeedsOptions};
    let mut o = SeedsOptions::defaults(a.quick);
    o.tiny |= a.tiny;
    o.only = a.only;
    o.runs = a.runs;
    o.dir = a.dir;
    o.image_tree = a.tree;
    let r = seeds::run(&o, &Interrupt::install()).map_err(cli_error)?;
    if let Some(dir) = &a.out {
        let files = seeds::write_out(&r, dir).map_err(cli_error)?;
        for f in files {
            eprintln!("wrote {}", f.display());
        }
    }
    print_report(a.json, &r)
}

fn run_nbd(a: RwArgs) -> CliResult {
    use crate::bench::scenarios::nbd;
    let o = a.options("bench nbd")?;
    let interrupt = Interrupt::install();
    let r = nbd::run(&o, &interrupt).map_err(cli_error)?;
    print_report(a.json, &r)
}

fn run_export(a: RwArgs) -> CliResult {
    use crate::bench::scenarios::export;
    // The table: median of 2 alternating rounds.
    let o = a.options_with_runs("bench export", Some(2))?;
    let interrupt = Interrupt::install();
    let r = export::run(&o, &interrupt).map_err(cli_error)?;
    print_report(a.json, &r)
}

fn run_reencrypt(a: ReencryptBenchArgs) -> CliResult {
    use crate::bench::scenarios::reencrypt::{self, ReencryptOptions};
    use std::io::IsTerminal;
    let o = ReencryptOptions {
        size: bench::parse_size(&a.size).map_err(cli_error)?,
        dirs: a.dir,
        runs: a.runs,
        resilience: a.resilience,
        progress: std::io::stderr().is_terminal(),
    };
    let interrupt = Interrupt::install();
    let r = reencrypt::run(&o, &interrupt).map_err(cli_error)?;
    print_report(a.json, &r)
}

fn run_fec(a: FecBenchArgs) -> CliResult {
    use crate::bench::scenarios::fec::{self, FecBenchOptions};
    let rw = a.rw.options("bench fec")?;
    let d = FecBenchOptions::defaults(rw.quick);
    let o = FecBenchOptions {
        size: rw.size,
        roots: a.fec_roots,
        damaged: a.damaged.unwrap_or(d.damaged),
        runs: rw.runs,
        runtime_ms: rw.runtime_ms,
        dir: rw.dir,
        progress: rw.progress,
        ..d
    };
    let interrupt = Interrupt::install();
    let r = fec::run(&o, &interrupt).map_err(cli_error)?;
    print_report(a.rw.json, &r)
}

fn run_remote(a: RemoteBenchArgs) -> CliResult {
    use crate::bench::scenarios::remote::{self, RemoteBenchOptions};
    use std::io::IsTerminal;
    let mut o = RemoteBenchOptions::defaults(a.quick);
    o.progress = std::io::stderr().is_terminal();
    if let Some(s) = &a.size {
        o.size = bench::parse_size(s).map_err(cli_error)?;
    }
    if let Some(r) = a.runs {
        o.runs = r;
    }
    if let Some(ms) = runtime_ms(a.runtime, "bench remote")? {
        o.runtime_ms = ms;
    }
    o.delays_ms = a.delays;
    o.dir = a.dir;
    let interrupt = Interrupt::install();
    let r = remote::run(&o, &interrupt).map_err(cli_error)?;
    print_report(a.json, &r)
}

/// `--runtime SECONDS` as whole milliseconds, refusing what fio could not run.
fn runtime_ms(seconds: Option<f64>, command: &str) -> Result<Option<u64>, CliError> {
    let Some(t) = seconds else {
        return Ok(None);
    };
    if !(t.is_finite() && t > 0.0 && t <= 3600.0) {
        return Err(CliError::invalid(format!(
            "{command}: --runtime must be in (0, 3600] seconds"
        )));
    }
    Ok(Some(((t * 1000.0).round() as u64).max(1)))
}
