//! A small ONNX graph builder: named values, nodes with generated output names, constants shared
//! by value, and weights whose data is produced only when the graph is written (a multi-GB
//! checkpoint is never held twice in memory).

use std::collections::HashMap;

use super::proto::{
    attribute_type, data_type, AttributeProto, NodeProto, TensorProto, ValueInfoProto,
};
use super::ExportError;
use crate::policy::pi0::quant::Group;

/// What a probed value is (`GraphBuilder::probe`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ProbeKind {
    /// The residual stream, as a norm takes it.
    Stream,
    LinearIn,
    LinearOut,
}

impl ProbeKind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            ProbeKind::Stream => "stream",
            ProbeKind::LinearIn => "linear_in",
            ProbeKind::LinearOut => "linear_out",
        }
    }
}

/// Produces a weight's values (row-major f32) when the graph is written.
pub(crate) type F32Source<'a> = Box<dyn Fn() -> Result<Vec<f32>, ExportError> + 'a>;
/// Produces a weight's bytes, already in the initializer's data type (quantized weights).
pub(crate) type RawSource<'a> = Box<dyn Fn() -> Result<Vec<u8>, ExportError> + 'a>;

pub(crate) enum InitData<'a> {
    /// Already encoded in the initializer's data type (small constants).
    Bytes(Vec<u8>),
    /// f32 values converted to the initializer's data type at write time.
    F32(F32Source<'a>),
    /// Weight bytes written as produced (int8, packed int4 and their scales).
    Raw(RawSource<'a>),
}

pub(crate) struct Initializer<'a> {
    pub(crate) name: String,
    pub(crate) dims: Vec<usize>,
    pub(crate) data_type: i32,
    pub(crate) data: InitData<'a>,
}

impl Initializer<'_> {
    pub(crate) fn numel(&self) -> usize {
        self.dims.iter().product()
    }

    pub(crate) fn byte_len(&self) -> usize {
        self.numel() * element_size(self.data_type)
    }
}

pub(crate) fn element_size(t: i32) -> usize {
    match t {
        data_type::FLOAT | data_type::INT32 => 4,
        data_type::INT64 => 8,
        data_type::FLOAT16 | data_type::BFLOAT16 => 2,
        _ => 1,
    }
}

pub(crate) struct GraphBuilder<'a> {
    pub(crate) name: String,
    pub(crate) nodes: Vec<NodeProto>,
    pub(crate) inputs: Vec<ValueInfoProto>,
    pub(crate) outputs: Vec<ValueInfoProto>,
    pub(crate) initializers: Vec<Initializer<'a>>,
    constants: HashMap<String, String>,
    /// Casts of initializers, made once however often a weight is used (unrolled steps).
    casts: HashMap<(String, i32), String>,
    /// Other nodes made once from initializers (a quantized weight's DequantizeLinear).
    shared: HashMap<String, String>,
    next: usize,
    /// Values whose magnitude `pi0d infer --activations` reports, with their label
    /// (`GROUP/KIND`): written into the model's metadata (`PROBES_KEY`).
    pub(crate) probes: Vec<(String, String)>,
}

/// The model metadata key listing the probed values (a JSON object: value name -> label).
pub(crate) const PROBES_KEY: &str = "pi0d.probes";

pub(crate) fn attr_int(name: &str, i: i64) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: attribute_type::INT,
        i,
        ..Default::default()
    }
}

pub(crate) fn attr_ints(name: &str, ints: &[i64]) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: attribute_type::INTS,
        ints: ints.to_vec(),
        ..Default::default()
    }
}

impl<'a> GraphBuilder<'a> {
    pub(crate) fn new(name: &str) -> GraphBuilder<'a> {
        GraphBuilder {
            name: name.into(),
            nodes: Vec::new(),
            inputs: Vec::new(),
            outputs: Vec::new(),
            initializers: Vec::new(),
            constants: HashMap::new(),
            casts: HashMap::new(),
            shared: HashMap::new(),
            next: 0,
            probes: Vec::new(),
        }
    }

    /// Marks `value` for the activation report: `group`'s residual stream, or a linear layer's
    /// input or output.
    pub(crate) fn probe(&mut self, value: &str, group: Option<Group>, kind: ProbeKind) {
        if let Some(group) = group {
            self.probes
                .push((value.into(), format!("{}/{}", group.name(), kind.name())));
        }
    }

    pub(crate) fn input(&mut self, name: &str, elem_type: i32, shape: &[usize]) -> String {
        self.inputs
            .push(ValueInfoProto::tensor(name, elem_type, shape));
        name.into()
    }

    /// Declares `value` a graph output named `name` (through an Identity when names differ).
    pub(crate) fn output(&mut self, value: &str, name: &str, elem_type: i32, shape: &[usize]) {
        if value != name {
            self.node("Identity", &[value], &[name], vec![]);
        }
        self.outputs
            .push(ValueInfoProto::tensor(name, elem_type, shape));
    }

    fn fresh(&mut self, op: &str) -> String {
        self.next += 1;
        format!("{}_{}", op.to_ascii_lowercase(), self.next)
    }

    fn node(&mut self, op: &str, inputs: &[&str], outputs: &[&str], attrs: Vec<AttributeProto>) {
        let name = format!("n{}_{op}", self.nodes.len());
        self.nodes.push(NodeProto {
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: outputs.iter().map(|s| s.to_string()).collect(),
            name,
            op_type: op.into(),
            attribute: attrs,
            ..Default::default()
        });
    }

    /// A single-output node; returns the output's name.
    pub(crate) fn op(&mut self, op: &str, inputs: &[&str], attrs: Vec<AttributeProto>) -> String {
        let out = self.fresh(op);
        self.node(op, inputs, &[&out], attrs);
        out
    }

    /// A node with `n` outputs.
    pub(crate) fn op_n(
        &mut self,
        op: &str,
        inputs: &[&str],
        n: usize,
        attrs: Vec<AttributeProto>,
    ) -> Vec<String> {
        let outs: Vec<String> = (0..n).map(|_| self.fresh(op)).collect();
        let refs: Vec<&str> = outs.iter().map(String::as_str).collect();
        self.node(op, inputs, &refs, attrs);
        outs
    }

    /// A weight initializer; a name already registered is shared (the same checkpoint tensor
    /// used again, e.g. by every unrolled step), not written twice.
    pub(crate) fn weight(
        &mut self,
        name: &str,
        dims: &[usize],
        data_type: i32,
        source: F32Source<'a>,
    ) -> String {
        if self.initializers.iter().any(|i| i.name == name) {
            return name.into();
        }
        self.initializers.push(Initializer {
            name: name.into(),
            dims: dims.to_vec(),
            data_type,
            data: InitData::F32(source),
        });
        name.into()
    }

    /// A weight initializer whose bytes `source` produces as they are written; shared by name
    /// as `weight` is.
    pub(crate) fn raw_weight(
        &mut self,
        name: &str,
        dims: &[usize],
        data_type: i32,
        source: RawSource<'a>,
    ) -> String {
        if self.initializers.iter().any(|i| i.name == name) {
            return name.into();
        }
        self.initializers.push(Initializer {
            name: name.into(),
            dims: dims.to_vec(),
            data_type,
            data: InitData::Raw(source),
        });
        name.into()
    }

    /// A single-output node of an operator outside the default domain (`com.microsoft`).
    pub(crate) fn op_in_domain(
        &mut self,
        domain: &str,
        op: &str,
        inputs: &[&str],
        attrs: Vec<AttributeProto>,
    ) -> String {
        let out = self.op(op, inputs, attrs);
        if let Some(n) = self.nodes.last_mut() {
            n.domain = domain.into();
        }
        out
    }

    /// `Cast(initializer, to)`, shared by every use of the initializer.
    pub(crate) fn cast_initializer(&mut self, name: &str, to: i32) -> String {
        let key = (name.to_string(), to);
        if let Some(out) = self.casts.get(&key) {
            return out.clone();
        }
        let out = self.op("Cast", &[name], vec![attr_int("to", to as i64)]);
        self.casts.insert(key, out.clone());
        out
    }

    /// A single-output node of initializers only, made once however often it is asked for
    /// (`key` names it).
    pub(crate) fn shared_op(
        &mut self,
        key: &str,
        op: &str,
        inputs: &[&str],
        attrs: Vec<AttributeProto>,
    ) -> String {
        if let Some(out) = self.shared.get(key) {
            return out.clone();
        }
        let out = self.op(op, inputs, attrs);
        self.shared.insert(key.into(), out.clone());
        out
    }

    fn constant(&mut self, key: String, dims: &[usize], data_type: i32, bytes: Vec<u8>) -> String {
        if let Some(name) = self.constants.get(&key) {
            return name.clone();
        }
        let name = format!("const_{}", self.constants.len());
        self.initializers.push(Initializer {
            name: name.clone(),
            dims: dims.to_vec(),
            data_type,
            data: InitData::Bytes(bytes),
        });
        self.constants.insert(key, name.clone());
        name
    }

    /// A 1-D int64 constant (shapes, axes, split sizes).
    pub(crate) fn i64s(&mut self, values: &[i64]) -> String {
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.constant(
            format!("i64{values:?}"),
            &[values.len()],
            data_type::INT64,
            bytes,
        )
    }

    /// A scalar int64 constant (Gather indices that drop the axis).
    pub(crate) fn i64_scalar(&mut self, value: i64) -> String {
        self.constant(
            format!("i64s{value}"),
            &[],
            data_type::INT64,
            value.to_le_bytes().to_vec(),
        )
    }

    /// A float32 constant tensor of shape `dims`.
    pub(crate) fn floats(&mut self, values: &[f32], dims: &[usize]) -> String {
        let bits: Vec<u32> = values.iter().map(|v| v.to_bits()).collect();
        let bytes = encode_f32(values, data_type::FLOAT);
        self.constant(
            format!("f32s{dims:?}{bits:?}"),
            dims,
            data_type::FLOAT,
            bytes,
        )
    }

    /// A scalar float constant of type `elem_type` (float32 or float16).
    pub(crate) fn scalar(&mut self, value: f32, elem_type: i32) -> String {
        let bytes = encode_f32(&[value], elem_type);
        self.constant(
            format!("f{elem_type}:{:08x}", value.to_bits()),
            &[],
            elem_type,
            bytes,
        )
    }
}

/// f32 values encoded as `elem_type` (float32, float16 or bfloat16), little-endian.
pub(crate) fn encode_f32(values: &[f32], elem_type: i32) -> Vec<u8> {
    match elem_type {
        data_type::FLOAT16 => values
            .iter()
            .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
            .collect(),
        data_type::BFLOAT16 => values
            .iter()
            .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
            .collect(),
        _ => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
    }
}

impl Initializer<'_> {
    /// The proto for this initializer with its data inline.
    pub(crate) fn inline_proto(&self, raw_data: Vec<u8>) -> TensorProto {
        TensorProto {
            dims: self.dims.iter().map(|&d| d as i64).collect(),
            data_type: self.data_type,
            name: self.name.clone(),
            raw_data,
            ..Default::default()
        }
    }
}
