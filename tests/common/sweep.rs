//! The sweep of real programs (issue 23, point 5): Debian programs doing
//! small real work, each recorded, its output checked against the native
//! run's, and its trace compared instruction by instruction, module by
//! module, with an oracle sharing none of our code (`exact.rs`, streaming):
//! valgrind lackey, or, where valgrind changes the program's path, the
//! native run single-stepped under ptrace with address randomisation off
//! (static glibc, whose CPU dispatch differs under valgrind; mawk, whose
//! `fclose` at exit fails under valgrind).
//!
//! One list and one comparison for both users: `bench/sweep.rs`
//! (`bench/run sweep`, every program) and the test topic `tests/sweep.rs`
//! (the fastest few, in CI). Programs that fork or exec children are run
//! in single-process forms (gcc's `cc1` directly, `make -n`, `tar`
//! without a compressor child), since the streaming comparison takes one
//! process.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Instant;

use super::exact::{self, ModuleCount};
use super::lackey;
use super::recorded::info_json;

/// Which oracle a program is compared with.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Oracle {
    Lackey,
    /// The native run under ptrace: of the rewritten copy with the
    /// original code put back when the program is static (its start-up
    /// reads its own program headers and `/proc/self/exe`), else of the
    /// program itself.
    Stepped,
}

/// One program of the sweep.
pub struct Program {
    /// How the table names it (`grep -E`, `git log`).
    pub name: &'static str,
    pub exe: PathBuf,
    pub args: Vec<String>,
    /// `--libs` (`none` when empty): the libraries doing the work.
    pub libs: &'static [&'static str],
    pub stdin: Option<PathBuf>,
    /// Variables added to the environment of every run.
    pub env: Vec<(String, String)>,
    pub oracle: Oracle,
}

impl Program {
    /// Why the program cannot run here, if it cannot.
    pub fn missing(&self) -> Option<String> {
        (!self.exe.exists()).then(|| format!("{} is not installed", self.exe.display()))
    }

    fn args(&self) -> Vec<&str> {
        self.args.iter().map(String::as_str).collect()
    }
}

/// A procedure the rewriter left alone (`aetrace info`).
#[derive(Debug)]
pub struct LeftAlone {
    pub module: PathBuf,
    pub name: String,
    pub reason: String,
}

impl LeftAlone {
    /// The reason without its addresses and details: what kind it is.
    pub fn kind(&self) -> &str {
        let r = self.reason.as_str();
        let cut = [" at 0x", " (", ":"].iter().filter_map(|c| r.find(c)).min();
        &r[..cut.unwrap_or(r.len())]
    }
}

/// What one program's sweep found.
pub struct Outcome {
    /// Per traced module: the oracle's side (instructions equal, and
    /// those in procedures left alone) and ours (`aetrace regen --count`).
    pub modules: Vec<(ModuleCount, u64)>,
    /// Every procedure left alone in a traced module.
    pub left_alone: Vec<LeftAlone>,
    pub record_seconds: f64,
    pub oracle_seconds: f64,
    /// `Err`: the first difference (or the output, or a failed step).
    pub verdict: Result<(), String>,
}

impl Outcome {
    /// Equal, and no instruction ran in a procedure left alone.
    pub fn exact(&self) -> bool {
        self.verdict.is_ok() && self.modules.iter().all(|(m, _)| m.untraced == 0)
    }

    /// The procedures left alone: each one that ran (its instructions
    /// and why it was left alone), then how many never ran, by kind.
    pub fn left_alone_report(&self) -> Vec<String> {
        let mut lines = Vec::new();
        let mut kinds: Vec<(&str, usize)> = Vec::new();
        for l in &self.left_alone {
            let ran = self.modules.iter().find_map(|(m, _)| {
                let mut hits = m.untraced_in.iter();
                (m.path == l.module).then(|| hits.find(|(n, _)| *n == l.name))?
            });
            match ran {
                Some((_, n)) => lines.push(format!(
                    "ran {n} instructions in {} of {}, left alone: {}",
                    l.name,
                    l.module.display(),
                    l.reason
                )),
                None => match kinds.iter_mut().find(|(k, _)| *k == l.kind()) {
                    Some((_, n)) => *n += 1,
                    None => kinds.push((l.kind(), 1)),
                },
            }
        }
        if !kinds.is_empty() {
            let kinds: Vec<String> = kinds.iter().map(|(k, n)| format!("{n} {k}")).collect();
            lines.push(format!("left alone, never run: {}", kinds.join(", ")));
        }
        lines
    }
}

/// The sweep's programs, their inputs written into `dir`: those of issue
/// 23's list first, then more.
pub fn programs(dir: &Path) -> Vec<Program> {
    std::fs::create_dir_all(dir).unwrap();
    let inputs = Inputs::write(dir);
    let f = |p: &Path| p.display().to_string();
    let (text, lines, small) = (f(&inputs.text), f(&inputs.lines), f(&inputs.small));
    let tree = f(&inputs.tree);
    let mut v = vec![
        p("mawk", "/usr/bin/mawk", &["{ n[$1]++ } END { for (w in n) s += n[w] * length(w); print s }", &small], &[]),
        p("sed", "/usr/bin/sed", &["-E", "s/(tr[a-z]+)/<\\1>/g; /block/d", &small], &[]),
        p("grep -E", "/usr/bin/grep", &["-E", "-c", "wit(ness|hout)|0x[0-9a-f]+$", &text], &[]),
        p("perl", "/usr/bin/perl", &["-e", "my %h; $h{$_}++ for map { split } <>; print join(',', map { \"$_=$h{$_}\" } sort keys %h), \"\\n\"", &small], &[]),
        p("python3", "/usr/bin/python3", &["-S", "-c", "import sys\nd = {}\nfor w in open(sys.argv[1]).read().split(): d[w] = d.get(w, 0) + 1\nprint(sorted(d.items())[:5])", &small], &[]),
        p("tclsh", "/usr/bin/tclsh8.6", &[&f(&inputs.tcl)], &["libtcl8.6.so"]),
        p("bc", "/usr/bin/bc", &["-l", &f(&inputs.bc)], &[]),
        p("sqlite3", "/usr/bin/sqlite3", &[":memory:", "create table t(k integer primary key, v text); with recursive c(x) as (select 1 union all select x + 1 from c where x < 300) insert into t select x, hex(x * x) from c; select count(*), sum(length(v)), max(v) from t where k % 7 = 3;"], &["libsqlite3.so.0"]),
        p("cc1 -O2", "/usr/lib/gcc/x86_64-linux-gnu/12/cc1", &["-quiet", "-O2", &f(&inputs.c), "-o", &f(&dir.join("prog.s"))], &[]),
        p("git log", "/usr/bin/git", &["-C", &f(&inputs.repo), "--no-pager", "log", "--stat"], &[]),
        p("git diff", "/usr/bin/git", &["-C", &f(&inputs.repo), "--no-pager", "diff", "HEAD~1"], &[]),
        p("tar", "/usr/bin/tar", &["-cf", &f(&dir.join("tree.tar")), "-C", &tree, "."], &[]),
        p("make -n", "/usr/bin/make", &["-n", "-C", &f(&inputs.make)], &[]),
        p("find", "/usr/bin/find", &[&tree, "-name", "*.c", "-o", "-size", "-2k", "-print"], &[]),
        p("sort", "/usr/bin/sort", &["-S", "16M", &lines], &[]),
        p("diff", "/usr/bin/diff", &["-u", &text, &f(&inputs.text2)], &[]),
        p("uniq", "/usr/bin/uniq", &["-c", &f(&inputs.sorted)], &[]),
        p("wc", "/usr/bin/wc", &[&text], &[]),
        p("cut", "/usr/bin/cut", &["-d", " ", "-f", "2,4", &small], &[]),
        p("md5sum", "/usr/bin/md5sum", &[&text], &[]),
        p("sha256sum", "/usr/bin/sha256sum", &[&text], &[]),
        p("gzip", "/usr/bin/gzip", &["-c", &text], &[]),
        p("bzip2", "/usr/bin/bzip2", &["-c", &text], &["libbz2.so.1.0"]),
        p("xz", "/usr/bin/xz", &["-c", &text], &["liblzma.so.5"]),
        p("cat", "/usr/bin/cat", &[&text], &[]),
        p("ls -l", "/usr/bin/ls", &["-l", &tree], &[]),
        p("head", "/usr/bin/head", &["-n", "40", &text], &[]),
        p("tail", "/usr/bin/tail", &["-n", "40", &text], &[]),
        p("od", "/usr/bin/od", &["-A", "x", "-t", "x1z", &small], &[]),
        p("date", "/usr/bin/date", &["-u", "-d", "@1000000000", "+%F %T %A %j"], &[]),
        p("expr", "/usr/bin/expr", &["123456789", "*", "987654321"], &[]),
        p("seq", "/usr/bin/seq", &["1", "7", "3000"], &[]),
        p("file", "/usr/bin/file", &[&text, "/usr/bin/sed"], &["libmagic.so.1"]),
        p("readelf", "/usr/bin/readelf", &["-h", "-S", "-d", "/usr/bin/sed"], &[]),
        p("objdump", "/usr/bin/objdump", &["-d", "-j", ".plt", "/usr/bin/cat"], &[]),
        p("jq", "/usr/bin/jq", &["-c", "[.[] | select(.n % 3 == 1) | .name]", &f(&inputs.json)], &["libjq.so.1"]),
        p("ldconfig -p", "/usr/sbin/ldconfig", &["-p"], &[]),
        p("zstd", "/usr/bin/zstd", &["-q", "--single-thread", "--no-asyncio", "-c", &text], &[]),
        p("base64", "/usr/bin/base64", &[&small], &[]),
        p("tac", "/usr/bin/tac", &[&small], &[]),
        p("nl", "/usr/bin/nl", &[&small], &[]),
        p("fold", "/usr/bin/fold", &["-w", "17", &small], &[]),
        p("paste", "/usr/bin/paste", &["-d", ":", &small, &lines], &[]),
        p("xxd", "/usr/bin/xxd", &[&small], &[]),
        p("tr", "/usr/bin/tr", &["a-z", "A-Z"], &[]),
        p("troff", "/usr/bin/troff", &["-Tascii", "-man", &f(&inputs.man)], &["libstdc++.so.6"]),
    ];
    // Where valgrind changes the program's path: mawk's `fclose` at exit
    // fails; grep and diff read `/proc/self/maps` (valgrind's own
    // mappings show); perl and make walk `environ`,
    // to which valgrind adds; static glibc dispatches on CPU features
    // valgrind hides; python3 (sets and dicts keyed by identity), tclsh
    // (hashes of addresses) and cc1 (its `ggc` page table) follow the
    // addresses of the process, which are valgrind's under lackey and
    // the native ones in the recorded run; so does troff (groff's
    // dictionaries hash a symbol by its string's address).
    for prog in &mut v {
        let stepped = [
            "mawk",
            "grep -E",
            "diff",
            "perl",
            "make -n",
            "ldconfig -p",
            "find",
            "tclsh",
            "python3",
            "cc1 -O2",
            "troff",
        ];
        if stepped.contains(&prog.name) {
            prog.oracle = Oracle::Stepped;
        }
        // Perl and Python hash their strings with a random seed otherwise;
        // pymalloc tests its arenas' alignment, which follows where mmap
        // put them (elsewhere under valgrind).
        let env = |vars: &[(&str, &str)]| vars.iter().map(|&(k, v)| (k.into(), v.into())).collect();
        if prog.name == "perl" {
            prog.env = env(&[("PERL_HASH_SEED", "0"), ("PERL_PERTURB_KEYS", "0")]);
        }
        if prog.name == "python3" {
            prog.env = env(&[("PYTHONHASHSEED", "0"), ("PYTHONMALLOC", "malloc")]);
        }
        if prog.name == "tr" {
            prog.stdin = Some(inputs.text.clone());
        }
    }
    v
}

fn p(name: &'static str, exe: &str, args: &[&str], libs: &'static [&'static str]) -> Program {
    Program {
        name,
        exe: PathBuf::from(exe),
        args: args.iter().map(|a| a.to_string()).collect(),
        libs,
        stdin: None,
        env: Vec::new(),
        oracle: Oracle::Lackey,
    }
}

/// The input files of the sweep.
struct Inputs {
    /// 20 kB of words ([`super::text_input`]), a variant of it, 2 kB of it.
    text: PathBuf,
    text2: PathBuf,
    small: PathBuf,
    lines: PathBuf,
    sorted: PathBuf,
    tree: PathBuf,
    c: PathBuf,
    tcl: PathBuf,
    bc: PathBuf,
    json: PathBuf,
    /// A manual page (troff: C++, its libstdc++ traced).
    man: PathBuf,
    make: PathBuf,
    repo: PathBuf,
}

impl Inputs {
    fn write(dir: &Path) -> Inputs {
        let put = |name: &str, bytes: &[u8]| {
            let path = dir.join(name);
            std::fs::write(&path, bytes).unwrap();
            path
        };
        let text = super::text_input(20_000);
        let mut text2 = text.clone();
        text2[5_000..5_100].reverse();
        text2[15_000..15_300].fill(b'x');
        let lines = super::recorded::sort_lines(2_000);
        let mut sorted: Vec<&str> = lines.lines().map(|l| &l[..l.len().min(2)]).collect();
        sorted.sort_unstable();
        let tree = dir.join("tree");
        for (k, name) in ["a.c", "b.txt", "sub/c.c", "sub/d.h", "sub/deep/e.txt"]
            .iter()
            .enumerate()
        {
            let path = tree.join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &text[..1_000 * (k * k + 1)]).unwrap();
        }
        let make = dir.join("make");
        std::fs::create_dir_all(&make).unwrap();
        std::fs::write(make.join("Makefile"), MAKEFILE).unwrap();
        let json: Vec<String> = (0..60)
            .map(|n| format!("{{\"n\":{n},\"name\":\"item{}\"}}", n * 7 % 60))
            .collect();
        Inputs {
            text: put("text", &text),
            text2: put("text2", &text2),
            small: put("small", &text[..2_000]),
            lines: put("lines", lines.as_bytes()),
            sorted: put("sorted", (sorted.join("\n") + "\n").as_bytes()),
            c: put("prog.c", C_PROGRAM.as_bytes()),
            tcl: put("script.tcl", TCL.as_bytes()),
            bc: put("pi.bc", b"scale = 60\n4 * a(1)\ne(1)\nquit\n"),
            json: put("items.json", format!("[{}]", json.join(",")).as_bytes()),
            man: put("page.1", MAN_PAGE.as_bytes()),
            repo: git_repo(dir, &text),
            tree,
            make,
        }
    }
}

/// cc1's input: declarations and initialised data, no function. The
/// first function makes cc1 initialise its back end (`initialize_rtl`:
/// some 42 million instructions, counted under lackey), which the
/// stepped oracle would take about 15 minutes more to follow; this file
/// makes a 15.9-million-instruction run.
const C_PROGRAM: &str = "struct node { struct node *next; int key; };
static int table[64] = { 1, 2, 3, 5, 8, 13, 21, 34 };
struct node tail = { 0, 7 }, head = { &tail, 3 };
const char *names[] = { \"witness\", \"edge\", \"block\", \"trace\" };
enum kind { LEAF, INNER = 4, ROOT };
typedef int (*cmp)(const void *, const void *);
extern int hash(const char *s);
int *first = &table[0], *last = &table[63];
";

const MAN_PAGE: &str = ".TH WITNESS 1
.SH NAME
witness \\- place one-byte witnesses on edges
.SH SYNOPSIS
.B witness
[\\fB\\-o\\fR \\fIfile\\fR] \\fIprogram\\fR
.SH DESCRIPTION
Places \\fBwitnesses\\fR on few edges of each procedure's graph:
.IP 1. 4
blocking witnesses on predicate edges that reach calls;
.IP 2. 4
a maximum spanning tree over the rest.
.TP
.B \\-o
the output file.
";

const TCL: &str = "set d [dict create]
foreach w [split [string repeat {the trace witness edge block of a program } 40]] {
    dict incr d $w
}
puts [lsort [dict keys $d]]
proc fib {n} { if {$n < 2} { return $n }; expr {[fib [expr {$n - 1}]] + [fib [expr {$n - 2}]]} }
puts [fib 15]
";

const MAKEFILE: &str = "SRCS := $(foreach n,1 2 3 4 5 6 7 8,mod$(n).c)
OBJS := $(patsubst %.c,%.o,$(SRCS))
all: prog
prog: $(OBJS)
\t$(CC) -o $@ $^
%.o: %.c
\t$(CC) -O2 -c $< -o $@
%.c:
\techo 'int f$(basename $@)(void) { return 1; }' > $@
";

/// A small git repository of two commits under `dir` (built by the native
/// git; none when git is missing).
fn git_repo(dir: &Path, text: &[u8]) -> PathBuf {
    let repo = dir.join("repo");
    let _ = std::fs::remove_dir_all(&repo);
    std::fs::create_dir_all(&repo).unwrap();
    let git = |args: &[&str]| {
        let _ = Command::new("/usr/bin/git")
            .arg("-C")
            .arg(&repo)
            .args(args)
            .envs([
                ("GIT_AUTHOR_DATE", "2001-09-09T01:46:40Z"),
                ("GIT_COMMITTER_DATE", "2001-09-09T01:46:40Z"),
            ])
            .output();
    };
    git(&["init", "-q"]);
    for (k, name) in ["notes.txt", "src.c"].iter().enumerate() {
        std::fs::write(repo.join(name), &text[..3_000 + 2_000 * k]).unwrap();
    }
    let commit = |m: &str| {
        git(&["add", "."]);
        git(&[
            "-c",
            "user.name=S",
            "-c",
            "user.email=s@e",
            "commit",
            "-q",
            "-m",
            m,
        ]);
    };
    commit("first");
    std::fs::write(repo.join("notes.txt"), &text[1_000..4_500]).unwrap();
    commit("second");
    repo
}

/// Runs the whole sweep of one program: native run, record, oracle.
pub fn sweep_one(prog: &Program, scratch: &Path) -> Outcome {
    let trace = scratch.join(format!("{}.aet", prog.name.replace([' ', '/'], "_")));
    let cache = scratch.join(format!("cache-{}", prog.name.replace([' ', '/'], "_")));
    let mut out = Outcome {
        modules: Vec::new(),
        left_alone: Vec::new(),
        record_seconds: 0.0,
        oracle_seconds: 0.0,
        verdict: Ok(()),
    };
    out.verdict = compare(prog, &trace, &cache, &mut out);
    let _ = std::fs::remove_file(&trace);
    let _ = std::fs::remove_dir_all(&cache);
    out
}

fn compare(prog: &Program, trace: &Path, cache: &Path, out: &mut Outcome) -> Result<(), String> {
    let args = prog.args();
    // The stepped oracle's runs (and so the recording) have exactly this
    // environment and address randomisation off.
    let mut env = vec![
        ("AETRACE_CACHE".to_string(), cache.display().to_string()),
        ("PATH".to_string(), "/usr/bin:/bin".to_string()),
    ];
    env.extend(prog.env.iter().cloned());
    // In the order the recorded program gets it: std's `Command` sorts an
    // environment it sets, and the stepper keeps the order it is given.
    env.sort();
    let fixed = (prog.oracle == Oracle::Stepped).then_some(&env[..]);
    // Lackey's run writes the program's stdout and stderr into files: so
    // do the native and recorded runs compared with it (tclsh seeks on
    // its stdout).
    let files = |tag: &str| (fixed.is_none()).then(|| trace.with_extension(tag));
    let native = match fixed {
        None => Some(run(
            Command::new(&prog.exe).args(&args),
            prog,
            None,
            files("native"),
        )),
        Some(_) => None,
    };
    let mut rec = Command::new(super::aetrace());
    rec.arg("record").arg("-o").arg(trace);
    let libs = if prog.libs.is_empty() {
        "none".to_string()
    } else {
        prog.libs.join(",")
    };
    rec.args(["--libs", &libs, "--"]).arg(&prog.exe).args(&args);
    let start = Instant::now();
    let recorded = run(&mut rec, prog, fixed, files("recorded"));
    out.record_seconds = start.elapsed().as_secs_f64();
    if !trace.exists() {
        return Err(format!(
            "no trace: {}",
            String::from_utf8_lossy(&recorded.stderr).trim()
        ));
    }
    let info = info_json(trace);
    out.left_alone = left_alone(&info);
    let start = Instant::now();
    let compared = match native {
        Some(native) => {
            same_run(&recorded, &native)?;
            let with = lackey::Launch {
                stdin: prog.stdin.as_deref(),
                env: &prog.env,
            };
            let c = exact::against_lackey_with(trace, &prog.exe, &args, &with);
            out.oracle_seconds = start.elapsed().as_secs_f64();
            c.map(|c| (c, native))
        }
        None => {
            let stepped = stepped(prog, trace, cache, &env);
            out.oracle_seconds = start.elapsed().as_secs_f64();
            stepped.and_then(|(c, native)| same_run(&recorded, &native).map(|()| (c, native)))
        }
    };
    let (compared, native) = compared?;
    let ours = ours_per_module(trace)?;
    out.modules = compared
        .modules
        .into_iter()
        .map(|m| {
            let n = ours
                .iter()
                .find(|(p, _)| *p == m.path)
                .map_or(0, |&(_, n)| n);
            (m, n)
        })
        .collect();
    if compared.status.code() != native.status.code() {
        return Err(format!(
            "the oracle's run ended with {}, the native one with {}",
            compared.status, native.status
        ));
    }
    Ok(())
}

/// The stepped oracle: the comparison, and the stepped run as the native
/// one (its output).
fn stepped(
    prog: &Program,
    trace: &Path,
    cache: &Path,
    env: &[(String, String)],
) -> Result<(exact::Compared, Output), String> {
    if prog.stdin.is_some() {
        return Err("the stepped oracle reads no stdin".into());
    }
    let elf = super::elf::Elf::read(&prog.exe);
    // The restored copy by a name of the program's length (its stack).
    let name = (!elf.sections.iter().any(|s| s.name == ".interp")).then(|| {
        let inst = super::singlestep::cached_rewrite(cache, &prog.exe);
        super::singlestep::restore_original_code(&prog.exe, &inst);
        super::singlestep::NativeName::new(&inst, &prog.exe)
    });
    let run_path = name.as_ref().map_or(&prog.exe, |n| &n.path);
    let (c, run) = exact::against_stepped(trace, run_path, &prog.exe, &prog.args(), env)?;
    let native = Output {
        status: c.status,
        stdout: run.stdout,
        stderr: run.stderr,
    };
    Ok((c, native))
}

/// Runs `cmd` with `prog`'s stdin; with exactly `env` and address
/// randomisation off when `env` is given.
fn run(
    cmd: &mut Command,
    prog: &Program,
    env: Option<&[(String, String)]>,
    files: Option<PathBuf>,
) -> Output {
    use std::os::unix::process::CommandExt;
    match &prog.stdin {
        Some(f) => cmd.stdin(std::fs::File::open(f).unwrap()),
        None => cmd.stdin(Stdio::null()),
    };
    match env {
        None => cmd.envs(prog.env.iter().map(|(k, v)| (k, v))),
        Some(env) => cmd.env_clear().envs(env.iter().map(|(k, v)| (k, v))),
    };
    if env.is_some() {
        // SAFETY: one async-signal-safe call between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::personality(libc::ADDR_NO_RANDOMIZE as libc::c_ulong) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let Some(base) = files else {
        return cmd
            .output()
            .unwrap_or_else(|e| panic!("{}: {e}", prog.exe.display()));
    };
    let (out, err) = (base.with_extension("stdout"), base.with_extension("stderr"));
    let create = |p: &Path| std::fs::File::create(p).unwrap();
    let status = cmd
        .stdout(create(&out))
        .stderr(create(&err))
        .status()
        .unwrap_or_else(|e| panic!("{}: {e}", prog.exe.display()));
    let read = |p: &Path| {
        let bytes = std::fs::read(p).unwrap_or_default();
        let _ = std::fs::remove_file(p);
        bytes
    };
    Output {
        status,
        stdout: read(&out),
        stderr: read(&err),
    }
}

/// The recorded run printed what the native one did and ended the same.
fn same_run(recorded: &Output, native: &Output) -> Result<(), String> {
    if recorded.stdout != native.stdout {
        return Err("the recorded run's stdout differs from the native one".into());
    }
    if recorded.stderr != native.stderr {
        return Err(format!(
            "the recorded run's stderr differs: {:?}",
            String::from_utf8_lossy(&recorded.stderr)
        ));
    }
    if recorded.status.code() != native.status.code() {
        return Err(format!(
            "recorded {}, native {}",
            recorded.status, native.status
        ));
    }
    Ok(())
}

/// Every procedure left alone in the trace's modules.
fn left_alone(info: &serde_json::Value) -> Vec<LeftAlone> {
    let mut v = Vec::new();
    for prog in info["programs"].as_array().into_iter().flatten() {
        let module = PathBuf::from(prog["path"].as_str().unwrap_or(""));
        for l in prog["left_alone"].as_array().into_iter().flatten() {
            let text = |k: &str| l[k].as_str().unwrap_or("?").to_string();
            v.push(LeftAlone {
                module: module.clone(),
                name: text("name"),
                reason: text("reason"),
            });
        }
    }
    v
}

/// Our instructions per module, all threads (`aetrace regen --count`).
fn ours_per_module(trace: &Path) -> Result<Vec<(PathBuf, u64)>, String> {
    let out = Command::new(super::aetrace())
        .args(["regen", "--count"])
        .arg(trace)
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "aetrace regen --count: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let mut v: Vec<(PathBuf, u64)> = Vec::new();
    // "thread 0 pid P tid T module PATH: N instructions, B blocks"
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some((_, rest)) = line.split_once(" module ") else {
            continue;
        };
        let Some((path, rest)) = rest.rsplit_once(": ") else {
            continue;
        };
        let n: u64 = rest
            .split(' ')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        match v.iter_mut().find(|(p, _)| p == Path::new(path)) {
            Some((_, m)) => *m += n,
            None => v.push((PathBuf::from(path), n)),
        }
    }
    Ok(v)
}
