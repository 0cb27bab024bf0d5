//! What an offline model computes: the ONNX graph its `.om` names, on ONNX Runtime's CPU
//! provider, with the static input and output sizes a compiled model has.

use std::path::Path;
use std::sync::OnceLock;

use ort::memory::Allocator;
use ort::session::Session;
use ort::tensor::TensorElementType;
use ort::value::{DynTensor, DynTensorValueType, ValueType};

/// One input or output of a compiled model: static shape, its byte size.
pub struct Io {
    pub name: String,
    pub ty: TensorElementType,
    pub shape: Vec<i64>,
    pub bytes: usize,
}

fn element_bytes(ty: TensorElementType) -> Option<usize> {
    use TensorElementType as T;
    Some(match ty {
        T::Float32 | T::Int32 | T::Uint32 => 4,
        T::Float16 | T::Bfloat16 | T::Int16 | T::Uint16 => 2,
        T::Float64 | T::Int64 | T::Uint64 => 8,
        T::Int8 | T::Uint8 | T::Bool => 1,
        _ => return None,
    })
}

fn io(name: &str, t: &ValueType) -> Result<Io, String> {
    let ValueType::Tensor { ty, shape, .. } = t else {
        return Err(format!("`{name}` is not a tensor"));
    };
    let dims: Vec<i64> = shape.iter().copied().collect();
    if dims.iter().any(|&d| d < 0) {
        // ATC compiles static shapes unless given --input_shape ranges; pi0d's graphs have none.
        return Err(format!("`{name}` has a dynamic shape {dims:?}"));
    }
    let size = element_bytes(*ty).ok_or_else(|| format!("`{name}`: unsupported type {ty:?}"))?;
    Ok(Io {
        name: name.to_string(),
        ty: *ty,
        shape: dims.clone(),
        bytes: dims.iter().product::<i64>() as usize * size,
    })
}

/// ONNX Runtime, loaded once from `ORT_DYLIB_PATH`.
fn runtime() -> Result<(), String> {
    static READY: OnceLock<Result<(), String>> = OnceLock::new();
    READY
        .get_or_init(|| {
            let lib = std::env::var("ORT_DYLIB_PATH").map_err(|_| {
                "the AscendCL model runs graphs on ONNX Runtime: set ORT_DYLIB_PATH".to_string()
            })?;
            ort::init_from(lib)
                .commit()
                .map(|_| ())
                .map_err(|e| format!("ONNX Runtime: {e}"))
        })
        .clone()
}

/// The graph's session with its inputs and outputs.
pub fn open(onnx: &Path) -> Result<(Session, Vec<Io>, Vec<Io>), String> {
    runtime()?;
    let session = Session::builder()
        .and_then(|b| b.with_intra_threads(1))
        .and_then(|b| b.commit_from_file(onnx))
        .map_err(|e| format!("{}: {e}", onnx.display()))?;
    let inputs = session
        .inputs
        .iter()
        .map(|i| io(&i.name, &i.input_type))
        .collect::<Result<Vec<_>, _>>()?;
    let outputs = session
        .outputs
        .iter()
        .map(|o| io(&o.name, &o.output_type))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((session, inputs, outputs))
}

/// Runs the graph on `data` (one byte slice per input, each at least the input's size; the
/// first bytes are taken, as a device buffer larger than the input is) and returns each
/// output's bytes.
pub fn run(
    session: &mut Session,
    inputs: &[Io],
    outputs: &[Io],
    data: &[&[u8]],
) -> Result<Vec<Vec<u8>>, String> {
    let allocator = Allocator::default();
    let mut values = Vec::with_capacity(inputs.len());
    for (io, bytes) in inputs.iter().zip(data) {
        let mut t = DynTensor::new(&allocator, io.ty, io.shape.clone())
            .map_err(|e| format!("input `{}`: {e}", io.name))?;
        // SAFETY: the tensor was just allocated with `io.bytes` bytes of `io.ty` and `bytes`
        // holds at least that many (checked when the execution was queued).
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), t.data_ptr_mut() as *mut u8, io.bytes);
        }
        values.push((io.name.clone(), t));
    }
    let result = session.run(values).map_err(|e| format!("execution: {e}"))?;
    let mut out = Vec::with_capacity(outputs.len());
    for io in outputs {
        let value = result
            .get(io.name.as_str())
            .ok_or_else(|| format!("no output `{}`", io.name))?;
        let tensor = value
            .downcast_ref::<DynTensorValueType>()
            .map_err(|e| format!("output `{}`: {e}", io.name))?;
        let mut bytes = vec![0u8; io.bytes];
        // SAFETY: the output is a tensor of the model's static shape and type: `io.bytes`.
        unsafe {
            std::ptr::copy_nonoverlapping(
                tensor.data_ptr() as *const u8,
                bytes.as_mut_ptr(),
                io.bytes,
            );
        }
        out.push(bytes);
    }
    Ok(out)
}
