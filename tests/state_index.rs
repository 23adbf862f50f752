//! `aetrace index` and `regen -j N` from the state index (`docs/regen.md`
//! section 4): on recorded runs, the bytes of `--format bin`/`block`,
//! `--count`, from pieces started at index entries of any interval (also
//! into a file, which the workers write at their offsets), equal
//! those of `-j 1` without an index (the oracle: the walk the lackey tests
//! check); a damaged or another trace's sidecar is ignored with one line.
//! Programs: Debian's gzip on 50 kB, and `traces/signal_alarm.c` (a 20 us
//! timer: pieces never start inside a handler), and
//! `traces/signal_threads.c` (several threads).

use crate::common::build::{build, run_checked, Link, Opt, Variant};
use crate::common::recorded::{record_ok, Knobs};
use crate::common::{aetrace, scratch};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const O2_PIE: Variant = Variant::new(Opt::O2, Link::Pie, false);

fn aet(args: &[&str], trace: &Path) -> Output {
    run_checked(
        Command::new(aetrace()).args(args).arg(trace),
        &format!("aetrace {args:?}"),
    )
}

/// Each format and `--count` with the index at several intervals and
/// piece sizes against `-j 1` without it. Each index is built once and
/// serves every format (an entry per stream byte takes seconds to build).
fn check_identical(trace: &Path) {
    let formats = ["bin", "block"];
    let wants = formats.map(|format| {
        aet(
            &["regen", "--no-index", "-j", "1", "--format", format],
            trace,
        )
        .stdout
    });
    for (interval, piece, jobs) in [
        ("4096", "8192", "2"),
        ("65536", "0", "3"),
        ("1", "1000", "2"),
    ] {
        aet(&["index", "--interval", interval], trace);
        for (format, want) in formats.iter().zip(&wants) {
            let args = ["regen", "-j", jobs, "--piece", piece, "--format", format];
            let got = aet(&args, trace).stdout;
            assert!(
                &got == want,
                "{} {args:?} interval {interval}: output differs",
                trace.display()
            );
            // Into a file, the workers write their pieces at their offsets
            // (once: each run costs the test time).
            let files = if interval == "4096" {
                into_files(&args, trace).to_vec()
            } else {
                Vec::new()
            };
            for (how, got) in files {
                assert!(
                    &got == want,
                    "{} {args:?} {how}, interval {interval}: output differs",
                    trace.display()
                );
            }
        }
    }
    let count = aet(&["regen", "--no-index", "--count", "-j", "1"], trace).stdout;
    let indexed = aet(&["regen", "--count", "-j", "2", "--piece", "4096"], trace).stdout;
    assert_eq!(
        String::from_utf8_lossy(&indexed),
        String::from_utf8_lossy(&count)
    );
}

/// The output of `aetrace ARGS TRACE` with `-o FILE`, and with stdout
/// a file: into files of their own beside the trace.
fn into_files(args: &[&str], trace: &Path) -> [(&'static str, Vec<u8>); 2] {
    let path = PathBuf::from(format!("{}.out", trace.display()));
    let mut o = args.to_vec();
    o.extend(["-o", path.to_str().unwrap()]);
    aet(&o, trace);
    let by_o = std::fs::read(&path).unwrap();
    let stdout = std::fs::File::create(&path).unwrap();
    run_checked(
        Command::new(aetrace()).args(args).arg(trace).stdout(stdout),
        &format!("aetrace {args:?} >FILE"),
    );
    let by_stdout = std::fs::read(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    [("-o FILE", by_o), (">FILE", by_stdout)]
}

fn gzip_trace() -> PathBuf {
    let input = scratch("state-index").join("gzip-input");
    std::fs::write(&input, crate::common::text_input(50_000)).unwrap();
    let gzip = Path::new("/usr/bin/gzip");
    record_ok(gzip, &["-c", input.to_str().unwrap()], &[], Knobs::DEFAULT).1
}

#[test]
fn indexed_pieces_of_gzip_equal_the_whole_walk() {
    check_identical(&gzip_trace());
}

#[test]
fn indexed_pieces_with_timer_signals_and_threads_equal_the_whole_walk() {
    let alarm = build("signal_alarm.c", O2_PIE);
    check_identical(&record_ok(&alarm, &[], &[], Knobs::DEFAULT).1);
    let threads = build("signal_threads.c", O2_PIE);
    check_identical(&record_ok(&threads, &["150"], &[], Knobs::DEFAULT).1);
}

/// A sidecar with a byte changed, or another trace's, is ignored with one
/// line naming it; the output is the trace's.
#[test]
fn a_damaged_or_stale_index_is_ignored_with_one_line() {
    let trace = gzip_trace();
    let want = aet(
        &["regen", "--no-index", "--format", "block", "-j", "1"],
        &trace,
    )
    .stdout;
    for (file, why) in bad_indexes(&trace, Knobs::DEFAULT, |n| n / 2) {
        let out = aet(
            &[
                "regen",
                "--index",
                file.to_str().unwrap(),
                "--format",
                "block",
                "-j",
                "2",
            ],
            &trace,
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.lines().count() == 1 && err.contains("warning: ignoring") && err.contains(why),
            "{err}"
        );
        assert!(out.stdout == want, "output with an ignored index differs");
    }
}

/// `trace`'s index with the byte at `at(file length)` changed, and
/// another trace's (`signal_alarm.c` recorded with `knobs`), with what the
/// warning about each says.
fn bad_indexes(trace: &Path, knobs: Knobs, at: fn(usize) -> usize) -> [(PathBuf, &'static str); 2] {
    aet(&["index", "--interval", "4096"], trace);
    let sidecar = PathBuf::from(format!("{}.idx", trace.display()));
    let mut bytes = std::fs::read(&sidecar).unwrap();
    let k = at(bytes.len());
    bytes[k] ^= 0x40;
    std::fs::write(&sidecar, &bytes).unwrap();
    let alarm = record_ok(&build("signal_alarm.c", O2_PIE), &[], &[], knobs).1;
    aet(&["index"], &alarm);
    let other = PathBuf::from(format!("{}.idx", alarm.display()));
    [
        (sidecar, "bad checksum"),
        (other, "built for another trace"),
    ]
}

/// Recording again to the same name removes the earlier trace's index,
/// which would only be ignored with a warning.
#[test]
fn recording_again_removes_the_earlier_index() {
    let trace = scratch("state-index-again").join("true.aet");
    let record = |args: &[&str]| {
        run_checked(
            Command::new(aetrace())
                .args(["record", "-o"])
                .arg(&trace)
                .args(["--", "/usr/bin/true"])
                .args(args),
            "aetrace record",
        )
    };
    record(&[]);
    aet(&["index"], &trace);
    let sidecar = PathBuf::from(format!("{}.idx", trace.display()));
    assert!(
        sidecar.exists(),
        "aetrace index wrote no {}",
        sidecar.display()
    );
    record(&["again"]);
    assert!(
        !sidecar.exists(),
        "{} outlived the re-recording",
        sidecar.display()
    );
    let out = aet(&["regen", "--format", "block"], &trace);
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The `-j` runs of each format in `check_data_identical`, for the index
/// `aetrace index` wrote and the one `regen` wrote: every format from the
/// first with three workers, `bin` with two from both, `lackey` from the
/// second. (Every format with 2 and 3 jobs from both indexes took 68 s of
/// the suite's 530, 2026-12-02: a run of a text format costs a second.)
const JOBS_BY_BUILD: [[&[&str]; 5]; 2] = [
    [&["2", "3"], &["3"], &["3"], &["3"], &["3"]],
    [&["2"], &[], &["2"], &[], &[]],
];

/// Each data format (`bin`, `xdin`, `lackey`), also for one thread and one
/// module, from an index with the data walk's states (`aetrace index`,
/// and the one the first whole `regen --data` writes) against `-j 1`
/// without an index, at the jobs of `JOBS_BY_BUILD`.
fn check_data_identical(trace: &Path, module: &str) {
    let sidecar = PathBuf::from(format!("{}.idx", trace.display()));
    let formats: [&[&str]; 5] = [
        &["--format", "bin", "--data"],
        &["--format", "xdin", "--data"],
        &["--format", "lackey"],
        &["--format", "lackey", "--thread", "0"],
        &["--format", "lackey", "--module", module],
    ];
    let wants: Vec<Vec<u8>> = formats
        .iter()
        .map(|format| {
            aet(
                &[&["regen", "--no-index", "-j", "1"][..], format].concat(),
                trace,
            )
            .stdout
        })
        .collect();
    let builds: [&[&str]; 2] = [
        &["index", "--interval", "4096"],
        &["regen", "--format", "bin", "--data"],
    ];
    for (build, jobs_of) in builds.into_iter().zip(JOBS_BY_BUILD) {
        let _ = std::fs::remove_file(&sidecar);
        aet(build, trace);
        assert!(sidecar.exists(), "{build:?} wrote no index");
        for ((format, want), jobs) in formats.iter().zip(&wants).zip(jobs_of) {
            for &jobs in jobs {
                let args = [&["regen", "-j", jobs, "--piece", "4096"][..], format].concat();
                let out = aet(&args, trace);
                assert!(
                    &out.stdout == want,
                    "{} {args:?} (index by {build:?}): output differs",
                    trace.display()
                );
                assert!(
                    out.stderr.is_empty(),
                    "{}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
    }
}

#[test]
fn indexed_data_pieces_equal_the_whole_walk() {
    let gzip = Path::new("/usr/bin/gzip");
    let input = scratch("state-index-data").join("gzip-input");
    std::fs::write(&input, crate::common::text_input(50_000)).unwrap();
    let args = ["-c", input.to_str().unwrap()];
    check_data_identical(&record_ok(gzip, &args, &[], Knobs::DATA).1, "gzip");
    for (source, args) in [
        ("signal_alarm.c", &[][..]),
        ("signal_threads.c", &["150"][..]),
        ("fork.c", &[][..]),
    ] {
        let exe = build(source, O2_PIE);
        let name = exe.file_name().unwrap().to_str().unwrap().to_owned();
        check_data_identical(&record_ok(&exe, args, &[], Knobs::DATA).1, &name);
    }
}

/// A data index damaged, or another trace's, is ignored with one line;
/// the output is the trace's.
#[test]
fn a_damaged_or_stale_data_index_is_ignored_with_one_line() {
    let gzip = Path::new("/usr/bin/gzip");
    let input = scratch("state-index-data-bad").join("gzip-input");
    std::fs::write(&input, crate::common::text_input(50_000)).unwrap();
    let trace = record_ok(gzip, &["-c", input.to_str().unwrap()], &[], Knobs::DATA).1;
    let format = ["--format", "bin", "--data"];
    let want = aet(
        &[&["regen", "--no-index", "-j", "1"][..], &format].concat(),
        &trace,
    )
    .stdout;
    // A byte of the last entry's data state changed.
    for (file, why) in bad_indexes(&trace, Knobs::DATA, |n| n - 40) {
        let index = ["regen", "--index", file.to_str().unwrap(), "-j", "2"];
        let out = aet(&[&index[..], &format].concat(), &trace);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.lines().count() == 1 && err.contains("warning: ignoring") && err.contains(why),
            "{err}"
        );
        assert!(out.stdout == want, "output with an ignored index differs");
    }
}
