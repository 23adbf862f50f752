//! Test kit shared by the runtime tests and the witness bench: maps the
//! generated runtime plus generated test routines into this process and
//! calls them, the way a rewritten program would.
#![allow(dead_code)] // each test binary uses a different part of the kit

use std::ffi::CString;

use aetrace_runtime::emit::{
    emit_buffer_check, emit_outside_entry, emit_witness, RuntimeAddrs, Site,
};
use aetrace_runtime::Blob;
use iced_x86::code_asm::*;
use iced_x86::BlockEncoderOptions;

/// Deterministic witness bytes in `lo..=hi` (xorshift64).
pub fn sequence(seed: u64, n: usize, lo: u8, hi: u8) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            lo + (x % (hi as u64 - lo as u64 + 1)) as u8
        })
        .collect()
}

/// The current thread's GS base.
pub fn get_gs() -> u64 {
    let mut v = 0u64;
    unsafe { libc::syscall(libc::SYS_arch_prctl, 0x1004, &mut v as *mut u64) };
    v
}

/// Sets the current thread's GS base (tests restore it after the runtime set it).
pub fn set_gs(v: u64) {
    assert_eq!(unsafe { libc::syscall(libc::SYS_arch_prctl, 0x1001, v) }, 0);
}

/// The stream prefix of a thread attached with parent `parent`.
pub fn thread_record(parent: u32) -> Vec<u8> {
    let mut v = vec![0xFF, 8];
    v.extend_from_slice(&parent.to_le_bytes());
    v
}

/// The ENTER record the runner's outside-entry stub writes.
pub fn enter_record(proc_id: u32) -> Vec<u8> {
    let mut v = vec![0xFF, 1];
    v.extend_from_slice(&proc_id.to_le_bytes());
    v
}

/// Code space reserved after the blob for test routines.
const TEST_SPACE: usize = 1 << 20;

/// The runtime blob and test routines mapped into this process.
pub struct Mapped {
    pub base: *mut u8,
    pub blob: Blob,
    len: usize,
    next: usize,
}

unsafe impl Send for Mapped {}
unsafe impl Sync for Mapped {}

impl Mapped {
    pub fn new() -> Mapped {
        let blob = aetrace_runtime::generate().expect("runtime generates");
        let len = blob.bytes.len().div_ceil(4096) * 4096 + TEST_SPACE;
        // SAFETY: fresh anonymous mapping.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED);
        let base = base as *mut u8;
        unsafe {
            std::ptr::copy_nonoverlapping(blob.bytes.as_ptr(), base, blob.bytes.len());
            // Code read+execute, the data page stays read+write.
            assert_eq!(
                libc::mprotect(
                    base as _,
                    blob.data_offset as usize,
                    libc::PROT_READ | libc::PROT_EXEC
                ),
                0
            );
        }
        let next = blob.bytes.len().div_ceil(4096) * 4096;
        // All test routines hold instrumented code: let signal entries
        // complete interrupted witness stores anywhere in that range.
        for (sym, off) in [("witness_code_start", next), ("witness_code_end", len)] {
            unsafe { *(base.add(blob.symbol(sym).unwrap() as usize) as *mut u64) = off as u64 };
        }
        Mapped {
            base,
            blob,
            len,
            next,
        }
    }

    pub fn addrs(&self) -> RuntimeAddrs {
        RuntimeAddrs::new(&self.blob, self.base as u64)
    }

    /// Interrupted witness stores the runtime completed at signal entries.
    pub fn fixups(&self) -> u64 {
        unsafe { std::ptr::read_volatile(self.sym("signal_fixups") as *const u64) }
    }

    pub fn sym(&self, name: &str) -> u64 {
        self.base as u64 + self.blob.symbol(name).expect("symbol")
    }

    /// Where the next placed routine starts.
    pub fn next_ip(&self) -> u64 {
        self.base as u64 + self.next as u64
    }

    /// Copies code assembled at [`Mapped::next_ip`] there; returns its address.
    pub fn place(&mut self, code: &[u8]) -> u64 {
        let ip = self.next_ip();
        let span = code.len().div_ceil(4096) * 4096;
        assert!(self.next + span <= self.len, "test code space exhausted");
        unsafe {
            let p = self.base.add(self.next);
            assert_eq!(
                libc::mprotect(p as _, span, libc::PROT_READ | libc::PROT_WRITE),
                0
            );
            std::ptr::copy_nonoverlapping(code.as_ptr(), p, code.len());
            assert_eq!(
                libc::mprotect(p as _, span, libc::PROT_READ | libc::PROT_EXEC),
                0
            );
        }
        self.next += span;
        ip
    }

    /// `init(0, NULL, envp)` with the given environment strings.
    pub fn init(&self, env: &[(&str, String)]) {
        let strs: Vec<CString> = env
            .iter()
            .map(|(k, v)| CString::new(format!("{k}={v}")).unwrap())
            .collect();
        let mut ptrs: Vec<*const libc::c_char> = strs.iter().map(|s| s.as_ptr()).collect();
        ptrs.push(std::ptr::null());
        let f: extern "C" fn(i32, *const u8, *const *const libc::c_char) =
            unsafe { std::mem::transmute(self.sym("init")) };
        f(0, std::ptr::null(), ptrs.as_ptr());
    }
}

/// A generated routine `fn(seq: *const u8, n: usize) -> u64` that enters
/// like a callback from untraced code (outside-entry stub: attach + ENTER
/// `proc_id`), then for each byte `w` of `seq` jumps through a table to the
/// site of witness `w`, with a buffer check at the loop header. Each site
/// checks that the registers (and, if live, the flags) survived. Returns 0,
/// or 1 when a site saw a clobbered register or flag.
pub fn runner(m: &mut Mapped, proc_id: u32, site: Site) -> extern "C" fn(*const u8, usize) -> u64 {
    let rt = m.addrs();
    let flush = rt.flush;
    let ip = m.next_ip();
    // A register the witness must preserve (any but the site's scratch).
    let sentinel = if site.scratch == Some(rax) { rsi } else { rax };
    // Pass 1: learn the site addresses; pass 2: same code with the table.
    let mut addrs = vec![0u64; 256];
    let mut code = None;
    for _pass in 0..2 {
        let mut a = CodeAssembler::new(64).unwrap();
        let mut lp = a.create_label();
        let mut done = a.create_label();
        let mut bad = a.create_label();
        let mut table = a.create_label();
        let mut sites: Vec<CodeLabel> = (0..256).map(|_| a.create_label()).collect();
        emit_outside_entry(&mut a, proc_id, &rt).unwrap();
        for r in [rbx, r12, r13, r14, r15, rbp] {
            a.push(r).unwrap();
        }
        a.mov(rbx, rdi).unwrap();
        a.mov(r12, rsi).unwrap();
        a.set_label(&mut lp).unwrap();
        a.test(r12, r12).unwrap();
        a.jz(done).unwrap();
        emit_buffer_check(
            &mut a,
            flush,
            Site {
                flags_live: false,
                ..site
            },
        )
        .unwrap();
        a.movzx(eax, byte_ptr(rbx)).unwrap();
        a.lea(rcx, ptr(table)).unwrap();
        a.jmp(qword_ptr(rcx + rax * 8)).unwrap();
        for w in 1..=254u8 {
            a.set_label(&mut sites[w as usize]).unwrap();
            a.mov(sentinel, rbx).unwrap();
            a.mov(rdx, 0x8000_0000_0000_0000u64).unwrap();
            a.add(rdx, rdx).unwrap(); // CF=1 OF=1 ZF=1 SF=0
            emit_witness(&mut a, w, site).unwrap();
            if site.flags_live {
                a.jnc(bad).unwrap();
                a.jno(bad).unwrap();
                a.jnz(bad).unwrap();
                a.js(bad).unwrap();
            }
            a.cmp(sentinel, rbx).unwrap();
            a.jne(bad).unwrap();
            a.test(rdx, rdx).unwrap();
            a.jnz(bad).unwrap();
            a.inc(rbx).unwrap();
            a.dec(r12).unwrap();
            a.jmp(lp).unwrap();
        }
        a.set_label(&mut bad).unwrap();
        a.mov(eax, 1u32).unwrap();
        let mut out = a.create_label();
        a.jmp(out).unwrap();
        a.set_label(&mut done).unwrap();
        a.xor(eax, eax).unwrap();
        a.set_label(&mut out).unwrap();
        for r in [rbp, r15, r14, r13, r12, rbx] {
            a.pop(r).unwrap();
        }
        a.ret().unwrap();
        a.set_label(&mut table).unwrap();
        a.dq(&addrs).unwrap();
        let res = assemble_labelled(&mut a, ip);
        let bad_ip = res.label_ip(&bad).unwrap();
        for w in 0..256 {
            addrs[w] = if (1..=254).contains(&w) {
                res.label_ip(&sites[w]).unwrap()
            } else {
                bad_ip
            };
        }
        code = Some(res.inner.code_buffer);
    }
    let code = code.expect("two passes ran");
    let f = m.place(&code);
    // SAFETY: the routine follows the SysV ABI with this signature.
    unsafe { std::mem::transmute::<u64, extern "C" fn(*const u8, usize) -> u64>(f) }
}

/// Assembles `a` at `ip` keeping its labels' addresses (`label_ip`).
pub fn assemble_labelled(a: &mut CodeAssembler, ip: u64) -> CodeAssemblerResult {
    a.assemble_options(ip, BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS)
        .unwrap()
}
