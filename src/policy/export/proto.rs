//! The subset of ONNX's protobuf schema (`onnx/onnx.proto`, IR version 8) that pi0d writes and
//! reads back, declared with prost's derive so that no protoc is needed at build time. Field
//! numbers are the schema's; names keep its spelling.

#![allow(clippy::derive_partial_eq_without_eq)]

use prost::Message;

/// `TensorProto.DataType` values pi0d uses.
pub(crate) mod data_type {
    pub(crate) const FLOAT: i32 = 1;
    pub(crate) const UINT8: i32 = 2;
    pub(crate) const INT8: i32 = 3;
    pub(crate) const INT32: i32 = 6;
    pub(crate) const INT64: i32 = 7;
    pub(crate) const BOOL: i32 = 9;
    pub(crate) const FLOAT16: i32 = 10;
    pub(crate) const BFLOAT16: i32 = 16;

    /// The name ONNX gives the type (as in manifests and error messages).
    pub(crate) fn name(t: i32) -> &'static str {
        match t {
            FLOAT => "float32",
            UINT8 => "uint8",
            INT8 => "int8",
            INT32 => "int32",
            INT64 => "int64",
            BOOL => "bool",
            FLOAT16 => "float16",
            BFLOAT16 => "bfloat16",
            _ => "unknown",
        }
    }
}

/// `AttributeProto.AttributeType` values.
pub(crate) mod attribute_type {
    pub(crate) const INT: i32 = 2;
    pub(crate) const INTS: i32 = 7;
}

#[derive(Clone, PartialEq, Message)]
pub struct ModelProto {
    #[prost(int64, tag = "1")]
    pub(crate) ir_version: i64,
    #[prost(message, repeated, tag = "8")]
    pub(crate) opset_import: Vec<OperatorSetIdProto>,
    #[prost(string, tag = "2")]
    pub(crate) producer_name: String,
    #[prost(string, tag = "3")]
    pub(crate) producer_version: String,
    #[prost(string, tag = "4")]
    pub(crate) domain: String,
    #[prost(int64, tag = "5")]
    pub(crate) model_version: i64,
    #[prost(string, tag = "6")]
    pub(crate) doc_string: String,
    #[prost(message, optional, tag = "7")]
    pub graph: Option<GraphProto>,
    #[prost(message, repeated, tag = "14")]
    pub(crate) metadata_props: Vec<StringStringEntryProto>,
}

#[derive(Clone, PartialEq, Message)]
pub(crate) struct OperatorSetIdProto {
    #[prost(string, tag = "1")]
    pub(crate) domain: String,
    #[prost(int64, tag = "2")]
    pub(crate) version: i64,
}

#[derive(Clone, PartialEq, Message)]
pub(crate) struct StringStringEntryProto {
    #[prost(string, tag = "1")]
    pub(crate) key: String,
    #[prost(string, tag = "2")]
    pub(crate) value: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct GraphProto {
    #[prost(message, repeated, tag = "1")]
    pub node: Vec<NodeProto>,
    #[prost(string, tag = "2")]
    pub(crate) name: String,
    #[prost(message, repeated, tag = "5")]
    pub initializer: Vec<TensorProto>,
    #[prost(string, tag = "10")]
    pub(crate) doc_string: String,
    #[prost(message, repeated, tag = "11")]
    pub(crate) input: Vec<ValueInfoProto>,
    #[prost(message, repeated, tag = "12")]
    pub(crate) output: Vec<ValueInfoProto>,
    #[prost(message, repeated, tag = "13")]
    pub(crate) value_info: Vec<ValueInfoProto>,
}

#[derive(Clone, PartialEq, Message)]
pub struct NodeProto {
    #[prost(string, repeated, tag = "1")]
    pub(crate) input: Vec<String>,
    #[prost(string, repeated, tag = "2")]
    pub(crate) output: Vec<String>,
    #[prost(string, tag = "3")]
    pub(crate) name: String,
    #[prost(string, tag = "4")]
    pub op_type: String,
    #[prost(message, repeated, tag = "5")]
    pub(crate) attribute: Vec<AttributeProto>,
    #[prost(string, tag = "6")]
    pub(crate) doc_string: String,
    #[prost(string, tag = "7")]
    pub domain: String,
}

#[derive(Clone, PartialEq, Message)]
pub(crate) struct AttributeProto {
    #[prost(string, tag = "1")]
    pub(crate) name: String,
    #[prost(int32, tag = "20")]
    pub(crate) r#type: i32,
    #[prost(float, tag = "2")]
    pub(crate) f: f32,
    #[prost(int64, tag = "3")]
    pub(crate) i: i64,
    #[prost(message, optional, tag = "5")]
    pub(crate) t: Option<TensorProto>,
    #[prost(int64, repeated, tag = "8")]
    pub(crate) ints: Vec<i64>,
}

#[derive(Clone, PartialEq, Message)]
pub struct TensorProto {
    #[prost(int64, repeated, tag = "1")]
    pub dims: Vec<i64>,
    #[prost(int32, tag = "2")]
    pub data_type: i32,
    #[prost(string, tag = "8")]
    pub name: String,
    #[prost(bytes = "vec", tag = "9")]
    pub raw_data: Vec<u8>,
    #[prost(message, repeated, tag = "13")]
    pub(crate) external_data: Vec<StringStringEntryProto>,
    /// 0: data in this message; 1: `external_data` says where.
    #[prost(int32, tag = "14")]
    pub(crate) data_location: i32,
}

#[derive(Clone, PartialEq, Message)]
pub(crate) struct ValueInfoProto {
    #[prost(string, tag = "1")]
    pub(crate) name: String,
    #[prost(message, optional, tag = "2")]
    pub(crate) r#type: Option<TypeProto>,
    #[prost(string, tag = "3")]
    pub(crate) doc_string: String,
}

#[derive(Clone, PartialEq, Message)]
pub(crate) struct TypeProto {
    #[prost(message, optional, tag = "1")]
    pub(crate) tensor_type: Option<TypeProtoTensor>,
}

#[derive(Clone, PartialEq, Message)]
pub(crate) struct TypeProtoTensor {
    #[prost(int32, tag = "1")]
    pub(crate) elem_type: i32,
    #[prost(message, optional, tag = "2")]
    pub(crate) shape: Option<TensorShapeProto>,
}

#[derive(Clone, PartialEq, Message)]
pub(crate) struct TensorShapeProto {
    #[prost(message, repeated, tag = "1")]
    pub(crate) dim: Vec<Dimension>,
}

#[derive(Clone, PartialEq, Message)]
pub(crate) struct Dimension {
    #[prost(oneof = "DimensionValue", tags = "1, 2")]
    pub(crate) value: Option<DimensionValue>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub(crate) enum DimensionValue {
    #[prost(int64, tag = "1")]
    DimValue(i64),
    #[prost(string, tag = "2")]
    DimParam(String),
}

impl ModelProto {
    /// The operator-set domains the model imports, with their versions (`""` is ONNX's).
    pub fn opset_domains(&self) -> Vec<(String, i64)> {
        self.opset_import
            .iter()
            .map(|o| (o.domain.clone(), o.version))
            .collect()
    }

    /// The names of the graph's inputs, in order.
    pub fn input_names(&self) -> Vec<String> {
        self.graph
            .iter()
            .flat_map(|g| &g.input)
            .map(|i| i.name.clone())
            .collect()
    }
}

impl NodeProto {
    /// The integer attribute `name`, if the node has it.
    pub fn attribute_int(&self, name: &str) -> Option<i64> {
        self.attribute
            .iter()
            .find(|a| a.name == name && a.r#type == attribute_type::INT)
            .map(|a| a.i)
    }
}

impl ValueInfoProto {
    /// A tensor of static shape.
    pub(crate) fn tensor(name: &str, elem_type: i32, shape: &[usize]) -> ValueInfoProto {
        ValueInfoProto {
            name: name.into(),
            r#type: Some(TypeProto {
                tensor_type: Some(TypeProtoTensor {
                    elem_type,
                    shape: Some(TensorShapeProto {
                        dim: shape
                            .iter()
                            .map(|&d| Dimension {
                                value: Some(DimensionValue::DimValue(d as i64)),
                            })
                            .collect(),
                    }),
                }),
            }),
            doc_string: String::new(),
        }
    }

    /// Element type and static shape, when this describes a tensor.
    pub(crate) fn tensor_shape(&self) -> Option<(i32, Vec<i64>)> {
        let t = self.r#type.as_ref()?.tensor_type.as_ref()?;
        let dims = t
            .shape
            .as_ref()?
            .dim
            .iter()
            .map(|d| match d.value {
                Some(DimensionValue::DimValue(v)) => v,
                _ => -1,
            })
            .collect();
        Some((t.elem_type, dims))
    }
}

/// Decodes a model file's bytes (for tests and `pi0d export` self-checks).
pub(crate) fn decode_model(bytes: &[u8]) -> Result<ModelProto, prost::DecodeError> {
    ModelProto::decode(bytes)
}
