//! Element types of windows and collectives: `f32`, `f64`, `u64`.

use std::fmt::Debug;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
    impl Sealed for u64 {}
}

/// Which element type a window holds; part of the allocation check across ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ElemKind {
    /// `f32`
    F32 = 1,
    /// `f64`
    F64 = 2,
    /// `u64`
    U64 = 3,
}

/// A type that windows and collectives carry. Sealed: `f32`, `f64` and `u64`.
///
/// Sums follow the type: IEEE addition for floats, wrapping addition for `u64` (as MPI_SUM does).
pub trait Elem:
    Copy + Default + PartialEq + PartialOrd + Debug + Send + Sync + 'static + sealed::Sealed
{
    /// The type tag.
    const KIND: ElemKind;
    /// The type's name, for messages.
    const NAME: &'static str;
    /// Same-size atomic cell the local backend stores elements in.
    #[doc(hidden)]
    type Atomic: Send + Sync + Debug;
    /// Whether the local backend serializes accumulates to a shard with a lock (its atomic add
    /// is a compare-and-swap loop) rather than adding element by element atomically.
    #[doc(hidden)]
    const LOCKED_ADD: bool;

    /// `self + other` (wrapping for integers).
    fn add(self, other: Self) -> Self;
    /// Smaller of the two.
    fn min(self, other: Self) -> Self {
        if other < self {
            other
        } else {
            self
        }
    }
    /// Larger of the two.
    fn max(self, other: Self) -> Self {
        if other > self {
            other
        } else {
            self
        }
    }

    #[doc(hidden)]
    fn atomic_new(v: Self) -> Self::Atomic;
    #[doc(hidden)]
    fn atomic_load(a: &Self::Atomic) -> Self;
    #[doc(hidden)]
    fn atomic_store(a: &Self::Atomic, v: Self);
    /// Atomically adds `v`, returning the previous value.
    #[doc(hidden)]
    fn atomic_fetch_add(a: &Self::Atomic, v: Self) -> Self;
    /// Atomically replaces the value by `new` if its bits equal `current`'s, returning the previous
    /// value.
    #[doc(hidden)]
    fn atomic_compare_swap(a: &Self::Atomic, current: Self, new: Self) -> Self;
    /// An atomic read ordered like the other atomics (acquire): what a one-sided atomic read sees.
    #[doc(hidden)]
    fn atomic_load_acquire(a: &Self::Atomic) -> Self;
    /// Atomically replaces the value by `v`, returning the previous value.
    #[doc(hidden)]
    fn atomic_swap(a: &Self::Atomic, v: Self) -> Self;

    /// The MPI datatype of the element.
    #[cfg(feature = "mpi")]
    #[doc(hidden)]
    fn mpi_datatype() -> mpi::ffi::MPI_Datatype;
}

macro_rules! float_elem {
    ($t:ty, $kind:ident, $atomic:ty, $mpi:ident) => {
        impl Elem for $t {
            const KIND: ElemKind = ElemKind::$kind;
            const NAME: &'static str = stringify!($t);
            type Atomic = $atomic;
            const LOCKED_ADD: bool = true;

            #[inline]
            fn add(self, other: Self) -> Self {
                self + other
            }
            #[inline]
            fn atomic_new(v: Self) -> Self::Atomic {
                <$atomic>::new(v.to_bits())
            }
            #[inline]
            fn atomic_load(a: &Self::Atomic) -> Self {
                <$t>::from_bits(a.load(Ordering::Relaxed))
            }
            #[inline]
            fn atomic_store(a: &Self::Atomic, v: Self) {
                a.store(v.to_bits(), Ordering::Relaxed)
            }
            #[inline]
            fn atomic_fetch_add(a: &Self::Atomic, v: Self) -> Self {
                let mut cur = a.load(Ordering::Relaxed);
                loop {
                    let new = (<$t>::from_bits(cur) + v).to_bits();
                    match a.compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Relaxed) {
                        Ok(prev) => return <$t>::from_bits(prev),
                        Err(actual) => cur = actual,
                    }
                }
            }
            #[inline]
            fn atomic_compare_swap(a: &Self::Atomic, current: Self, new: Self) -> Self {
                match a.compare_exchange(
                    current.to_bits(),
                    new.to_bits(),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(prev) | Err(prev) => <$t>::from_bits(prev),
                }
            }
            #[inline]
            fn atomic_load_acquire(a: &Self::Atomic) -> Self {
                <$t>::from_bits(a.load(Ordering::Acquire))
            }
            #[inline]
            fn atomic_swap(a: &Self::Atomic, v: Self) -> Self {
                <$t>::from_bits(a.swap(v.to_bits(), Ordering::AcqRel))
            }
            #[cfg(feature = "mpi")]
            #[inline]
            fn mpi_datatype() -> mpi::ffi::MPI_Datatype {
                // SAFETY: a constant datatype handle exported by rsmpi's C shim, initialised before
                // `main` and never written.
                unsafe { mpi::ffi::$mpi }
            }
        }
    };
}

float_elem!(f32, F32, AtomicU32, RSMPI_FLOAT);
float_elem!(f64, F64, AtomicU64, RSMPI_DOUBLE);

impl Elem for u64 {
    const KIND: ElemKind = ElemKind::U64;
    const NAME: &'static str = "u64";
    type Atomic = AtomicU64;
    const LOCKED_ADD: bool = false;

    #[inline]
    fn add(self, other: Self) -> Self {
        self.wrapping_add(other)
    }
    #[inline]
    fn atomic_new(v: Self) -> Self::Atomic {
        AtomicU64::new(v)
    }
    #[inline]
    fn atomic_load(a: &Self::Atomic) -> Self {
        a.load(Ordering::Relaxed)
    }
    #[inline]
    fn atomic_store(a: &Self::Atomic, v: Self) {
        a.store(v, Ordering::Relaxed)
    }
    #[inline]
    fn atomic_fetch_add(a: &Self::Atomic, v: Self) -> Self {
        a.fetch_add(v, Ordering::AcqRel)
    }
    #[inline]
    fn atomic_compare_swap(a: &Self::Atomic, current: Self, new: Self) -> Self {
        match a.compare_exchange(current, new, Ordering::AcqRel, Ordering::Acquire) {
            Ok(prev) | Err(prev) => prev,
        }
    }
    #[inline]
    fn atomic_load_acquire(a: &Self::Atomic) -> Self {
        a.load(Ordering::Acquire)
    }
    #[inline]
    fn atomic_swap(a: &Self::Atomic, v: Self) -> Self {
        a.swap(v, Ordering::AcqRel)
    }
    #[cfg(feature = "mpi")]
    #[inline]
    fn mpi_datatype() -> mpi::ffi::MPI_Datatype {
        // SAFETY: a constant datatype handle exported by rsmpi's C shim, never written.
        unsafe { mpi::ffi::RSMPI_UINT64_T }
    }
}

/// Reduction operators of `allreduce`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    /// Elementwise sum.
    Sum,
    /// Elementwise minimum.
    Min,
    /// Elementwise maximum.
    Max,
}

impl ReduceOp {
    /// Applies the operator to two elements.
    #[inline]
    pub fn apply<T: Elem>(self, a: T, b: T) -> T {
        match self {
            Self::Sum => a.add(b),
            Self::Min => a.min(b),
            Self::Max => a.max(b),
        }
    }
}
