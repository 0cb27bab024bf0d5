//! Device memory: allocations at addresses no host pointer has, copies checked by kind.

use std::collections::BTreeMap;

use super::{Fail, State};
use crate::codes::*;

/// Device addresses start here: outside any host address space (non-canonical on x86-64 and
/// aarch64), so a device pointer is never host memory and a host pointer never device memory.
const DEVICE_BASE: u64 = 0x4000_0000_0000_0000;
/// Gap between allocations: a pointer run past one never lands in the next.
const GUARD: u64 = 1 << 16;
/// What fresh device memory holds (the real runtime does not clear it).
const FRESH: u8 = 0xA5;

/// The allocation of `memory` holding `[address, address + len)`: its start, and those bytes.
pub(super) fn allocation(
    memory: &BTreeMap<u64, Vec<u8>>,
    address: u64,
    len: usize,
) -> Option<(u64, &[u8])> {
    let (&base, bytes) = memory.range(..=address).next_back()?;
    let off = usize::try_from(address - base).ok()?;
    Some((base, bytes.get(off..off.checked_add(len)?)?))
}

impl State {
    pub fn malloc(&mut self, size: usize, policy: i32) -> Result<u64, Fail> {
        self.current()?;
        if size == 0 || !(0..=5).contains(&policy) {
            return Err(Fail::param(format!("size {size}, policy {policy}")));
        }
        self.mallocs += 1;
        if self
            .faults
            .malloc_fail_after
            .is_some_and(|n| self.mallocs > n)
        {
            return Err(Fail::new(
                ACL_ERROR_RT_MEMORY_ALLOCATION,
                "device memory allocation refused (ACL_MODEL_MALLOC_FAIL_AFTER)",
            ));
        }
        if self.used + size > self.memory_limit {
            return Err(Fail::new(
                ACL_ERROR_RT_MEMORY_ALLOCATION,
                format!(
                    "{size} bytes asked, {} of {} in use",
                    self.used, self.memory_limit
                ),
            ));
        }
        let address = DEVICE_BASE + self.next_address;
        self.next_address += (size as u64).div_ceil(GUARD) * GUARD + GUARD;
        self.memory.insert(address, vec![FRESH; size]);
        self.used += size;
        Ok(address)
    }

    pub fn free(&mut self, address: u64) -> Result<(), Fail> {
        if !self.initialized {
            return Err(Fail::new(ACL_ERROR_UNINITIALIZE, "aclInit was not called"));
        }
        let Some(bytes) = self.memory.remove(&address) else {
            return Err(Fail::new(
                ACL_ERROR_RT_MEMORY_FREE,
                format!("{address:#x} is not the start of a device allocation (freed twice?)"),
            ));
        };
        self.used -= bytes.len();
        Ok(())
    }

    /// The allocation holding `[address, address + len)`: its start.
    pub(super) fn device_range(&self, address: u64, len: usize, what: &str) -> Result<u64, Fail> {
        match allocation(&self.memory, address, len) {
            Some((base, _)) => Ok(base),
            None => Err(Fail::new(
                ACL_ERROR_RT_PARAM_INVALID,
                format!("{what} {address:#x} (+{len} bytes) is not inside a device allocation"),
            )),
        }
    }

    fn is_device(address: u64) -> bool {
        address >= DEVICE_BASE
    }

    pub fn memcpy(
        &mut self,
        dst: u64,
        dest_max: usize,
        src: u64,
        count: usize,
        kind: i32,
    ) -> Result<(), Fail> {
        self.current()?;
        if dst == 0 || src == 0 || count > dest_max {
            return Err(Fail::param(format!(
                "dst {dst:#x}, src {src:#x}, count {count} > destMax {dest_max}"
            )));
        }
        let (src_device, dst_device) = match kind {
            ACL_MEMCPY_HOST_TO_HOST => (false, false),
            ACL_MEMCPY_HOST_TO_DEVICE => (false, true),
            ACL_MEMCPY_DEVICE_TO_HOST => (true, false),
            ACL_MEMCPY_DEVICE_TO_DEVICE => (true, true),
            _ => return Err(Fail::param(format!("copy kind {kind}"))),
        };
        for (address, device, what) in [
            (src, src_device, "source"),
            (dst, dst_device, "destination"),
        ] {
            if Self::is_device(address) != device {
                return Err(Fail::new(
                    ACL_ERROR_RT_PARAM_INVALID,
                    format!(
                        "copy kind {kind}: the {what} {address:#x} is {} memory",
                        if device { "host" } else { "device" }
                    ),
                ));
            }
        }
        let data: Vec<u8> = if src_device {
            let base = self.device_range(src, count, "source")?;
            let off = (src - base) as usize;
            self.memory[&base][off..off + count].to_vec()
        } else {
            // SAFETY: the caller's host source holds `count` bytes (AscendCL's contract).
            unsafe { std::slice::from_raw_parts(src as *const u8, count) }.to_vec()
        };
        if dst_device {
            let base = self.device_range(dst, count, "destination")?;
            let off = (dst - base) as usize;
            if let Some(m) = self.memory.get_mut(&base) {
                m[off..off + count].copy_from_slice(&data);
            }
        } else {
            // SAFETY: the caller's host destination holds `destMax` >= `count` bytes.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst as *mut u8, count) };
        }
        Ok(())
    }
}
