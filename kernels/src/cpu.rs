//! Which instruction set the kernels were compiled for, and whether this CPU has it; and the
//! instructions of the kernels that choose theirs at run time ([`Isa`]).
//!
//! The `wide` kernels use AVX2/FMA/AVX-512 only when the crate is compiled with those target
//! features, so the instruction set is fixed at build time (`.cargo/config.toml`: `x86-64-v3` by
//! default). A binary run on a CPU without one of its features dies with SIGILL at the first such
//! instruction, with no message; [`check`] compares the compiled-for features with the CPU's
//! (`is_x86_feature_detected!`) so that the binary can stop first, naming what is missing.

/// Bytes in a cache line on every x86-64 CPU the kernels target: the unit of their prefetches
/// ([`crate::mlp`]) and of the binary's buffer alignment ([`crate::alloc`]).
pub const CACHE_LINE: usize = 64;

/// One x86-64 feature: its name (as `target_feature` and `is_x86_feature_detected!` spell it),
/// whether this build was compiled for it, and whether the CPU running it has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Feature {
    /// The feature's name, e.g. `avx2`.
    pub name: &'static str,
    /// Compiled with `-C target-feature=+name` (directly or through `target-cpu`).
    pub compiled: bool,
    /// Reported by the CPU (CPUID, as the standard library detects it).
    pub detected: bool,
}

/// The features that the x86-64 micro-architecture levels add (v2, v3, v4), the ones a
/// `target-cpu` choice can make the compiler emit in ordinary code.
macro_rules! features {
    ($($f:tt),* $(,)?) => {
        /// Every feature of the x86-64-v2, v3 and v4 levels: compiled for, detected.
        #[cfg(target_arch = "x86_64")]
        pub fn features() -> Vec<Feature> {
            vec![$(Feature {
                name: $f,
                compiled: cfg!(target_feature = $f),
                detected: std::arch::is_x86_feature_detected!($f),
            }),*]
        }
    };
}

features!(
    "sse3",
    "ssse3",
    "sse4.1",
    "sse4.2",
    "popcnt",
    "cmpxchg16b", // x86-64-v2
    "avx",
    "avx2",
    "bmi1",
    "bmi2",
    "f16c",
    "fma",
    "lzcnt",
    "movbe",
    "xsave", // x86-64-v3
    "avx512f",
    "avx512bw",
    "avx512cd",
    "avx512dq",
    "avx512vl", // x86-64-v4
);

/// Other architectures: the build targets the CPU it runs on; nothing to check.
#[cfg(not(target_arch = "x86_64"))]
pub fn features() -> Vec<Feature> {
    Vec::new()
}

/// The instruction set the SIMD kernels were compiled for, in words.
pub fn compiled_level() -> &'static str {
    if cfg!(all(target_feature = "avx512f", target_feature = "avx512bw", target_feature = "avx512vl")) {
        "AVX-512 (x86-64-v4)"
    } else if cfg!(all(target_feature = "avx2", target_feature = "fma")) {
        "AVX2+FMA (x86-64-v3)"
    } else if cfg!(target_feature = "avx") {
        "AVX"
    } else if cfg!(target_arch = "x86_64") {
        "SSE2 (x86-64)"
    } else {
        std::env::consts::ARCH
    }
}

/// The best level this CPU supports, in words.
pub fn detected_level(features: &[Feature]) -> &'static str {
    let has = |names: &[&str]| names.iter().all(|n| features.iter().any(|f| f.name == *n && f.detected));
    if features.is_empty() {
        std::env::consts::ARCH
    } else if has(&["avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"]) {
        "AVX-512 (x86-64-v4)"
    } else if has(&["avx2", "fma", "bmi1", "bmi2", "lzcnt", "movbe", "f16c"]) {
        "AVX2+FMA (x86-64-v3)"
    } else {
        "below x86-64-v3"
    }
}

/// The build's level, the CPU's and the MLP products' micro-kernel, in words: `compiled for AVX2+FMA
/// (x86-64-v3); CPU: AVX-512 (x86-64-v4); MLP products: AVX-512 (chosen at run time)`.
pub fn summary() -> String {
    format!(
        "compiled for {}; CPU: {}; MLP products: {} (chosen at run time)",
        compiled_level(),
        detected_level(&features()),
        Isa::best().name()
    )
}

/// Features this build was compiled for that the CPU lacks. `detected`, when given, replaces the
/// CPU's answer with that set of names (to test the check on a CPU that has everything).
pub fn missing(features: &[Feature], detected: Option<&[&str]>) -> Vec<&'static str> {
    features
        .iter()
        .filter(|f| f.compiled)
        .filter(|f| match detected {
            Some(set) => !set.contains(&f.name),
            None => !f.detected,
        })
        .map(|f| f.name)
        .collect()
}

/// `Err` with a message naming the missing features when this CPU cannot run this build.
/// `detected` as in [`missing`].
pub fn check(detected: Option<&[&str]>) -> Result<(), String> {
    let all = features();
    let lacking = missing(&all, detected);
    if lacking.is_empty() {
        return Ok(());
    }
    let compiled: Vec<&str> = all.iter().filter(|f| f.compiled).map(|f| f.name).collect();
    Err(format!(
        "this binary was compiled for {} (target features {}) but this CPU lacks {}: it would stop with \
         an illegal instruction. Run it on a newer CPU, or build for this one: \
         RUSTFLAGS=\"-C target-cpu=native\" cargo build --release (or -C target-cpu=x86-64 for any x86-64)",
        compiled_level(),
        compiled.join(","),
        lacking.join(", ")
    ))
}

/// The instructions of the kernels that choose theirs at run time (the MLP's GEMM micro-kernel,
/// [`crate::mlp::simd::gemm`]), and of the FMA probe that measures their peak
/// ([`crate::roofline::fma_peak_gflops`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// `wide::f32x8` (8 lanes; the GEMM's tile 6x16): AVX2+FMA in the default (x86-64-v3)
    /// build.
    F32x8,
    /// AVX-512F (16 lanes; the GEMM's tile 8x32), on x86-64 CPUs that have it (checked at run
    /// time, whatever level the build was compiled for).
    Avx512,
}

impl Default for Isa {
    /// [`Isa::best`].
    fn default() -> Isa {
        Isa::best()
    }
}

impl Isa {
    /// Every one, narrowest first.
    pub const ALL: [Isa; 2] = [Isa::F32x8, Isa::Avx512];

    /// Those this CPU runs, narrowest first (tests and benches run each).
    pub fn runnable() -> impl Iterator<Item = Isa> {
        Isa::ALL.into_iter().filter(|isa| isa.available())
    }

    /// The widest the CPU runs: [`Isa::Avx512`] where it has AVX-512F, else [`Isa::F32x8`].
    pub fn best() -> Isa {
        if Isa::Avx512.available() {
            Isa::Avx512
        } else {
            Isa::F32x8
        }
    }

    /// Whether this CPU runs it ([`Isa::F32x8`]: always, the binary checks its own target
    /// features at start-up).
    pub fn available(self) -> bool {
        match self {
            Isa::F32x8 => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => std::arch::is_x86_feature_detected!("avx512f"),
            #[cfg(not(target_arch = "x86_64"))]
            Isa::Avx512 => false,
        }
    }

    /// f32 lanes of one FMA.
    pub fn lanes(self) -> usize {
        match self {
            Isa::F32x8 => 8,
            Isa::Avx512 => 16,
        }
    }

    /// A name for reports: `f32x8` is whatever the build makes of `wide::f32x8` (AVX2+FMA in
    /// the default x86-64-v3 build).
    pub fn name(self) -> &'static str {
        match self {
            Isa::F32x8 => "f32x8",
            Isa::Avx512 => "AVX-512",
        }
    }
}

/// The size of one core's L2 cache in bytes, as Linux reports it for CPU 0
/// (`/sys/devices/system/cpu/cpu0/cache/index*/`, the level-2 data or unified cache); `None`
/// where the files are missing or unreadable (other systems, some containers).
pub fn l2_bytes() -> Option<usize> {
    let dir = std::path::Path::new("/sys/devices/system/cpu/cpu0/cache");
    (0..16).find_map(|i| {
        let read = |f: &str| std::fs::read_to_string(dir.join(format!("index{i}/{f}"))).ok();
        let level = read("level")?;
        let kind = read("type")?;
        if level.trim() != "2" || kind.trim() == "Instruction" {
            return None;
        }
        cache_size(&read("size")?)
    })
}

/// A cache size as sysfs writes it (`2048K`, `1M`, or bytes), in bytes.
fn cache_size(text: &str) -> Option<usize> {
    let t = text.trim();
    let (digits, unit) = match t.strip_suffix(['K', 'k']) {
        Some(d) => (d, 1024),
        None => match t.strip_suffix(['M', 'm']) {
            Some(d) => (d, 1024 * 1024),
            None => (t, 1),
        },
    };
    digits.parse::<usize>().ok().filter(|&n| n > 0).and_then(|n| n.checked_mul(unit))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_sizes_read_as_sysfs_writes_them() {
        assert_eq!(cache_size("2048K\n"), Some(2 << 20));
        assert_eq!(cache_size("48K"), Some(48 << 10));
        assert_eq!(cache_size("1M"), Some(1 << 20));
        assert_eq!(cache_size("4096"), Some(4096));
        for bad in ["", "K", "0K", "-1K", "2 MB", "lots"] {
            assert_eq!(cache_size(bad), None, "{bad:?}");
        }
        // Where Linux reports one, it is a plausible L2 (64 KiB to 64 MiB).
        if let Some(l2) = l2_bytes() {
            assert!((64 << 10..=64 << 20).contains(&l2), "{l2}");
        }
    }

    #[test]
    fn the_build_runs_on_this_cpu() {
        assert_eq!(check(None), Ok(()));
        assert!(missing(&features(), None).is_empty());
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn a_cpu_without_the_compiled_features_is_named() {
        let all = features();
        let compiled: Vec<&str> = all.iter().filter(|f| f.compiled).map(|f| f.name).collect();
        // The default build targets x86-64-v3: it must be compiled for AVX2 and FMA.
        assert!(compiled.contains(&"avx2") && compiled.contains(&"fma"), "{compiled:?}");
        let without_avx2: Vec<&str> = compiled.iter().copied().filter(|n| *n != "avx2").collect();
        assert_eq!(missing(&all, Some(&without_avx2)), vec!["avx2"]);
        let e = check(Some(&["sse3"])).expect_err("a CPU with only SSE3 cannot run this build");
        assert!(e.contains("lacks") && e.contains("avx2") && e.contains("fma"), "{e}");
        assert_eq!(check(Some(&compiled)), Ok(()));
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn levels_read_the_feature_sets() {
        let f = |names: &[&'static str]| -> Vec<Feature> {
            names.iter().map(|n| Feature { name: n, compiled: false, detected: true }).collect()
        };
        assert_eq!(detected_level(&f(&["sse3", "avx"])), "below x86-64-v3");
        let v3 = ["avx2", "fma", "bmi1", "bmi2", "lzcnt", "movbe", "f16c"];
        assert_eq!(detected_level(&f(&v3)), "AVX2+FMA (x86-64-v3)");
        let v4: Vec<&'static str> =
            v3.iter().copied().chain(["avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"]).collect();
        assert_eq!(detected_level(&f(&v4)), "AVX-512 (x86-64-v4)");
    }
}
