//! Why the pipeline refused a checkpoint, an observation or a run.

use std::path::PathBuf;
use std::sync::Arc;

use super::super::checkpoint::CheckpointError;
use super::super::infer::NonFiniteActions;
use super::super::preprocess::FrameError;
use super::super::processor::tokenize::TooLong;
use super::super::processor::ProcessorError;
use super::MAX_PROMPT_BYTES;
use crate::policy::graph::GraphError;

#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error("{path}: cannot load the tokenizer")]
    Tokenizer {
        path: PathBuf,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("{path}: the tokenizer has ids up to {largest}, but the model's embedding table ({checkpoint}) has {vocab} rows")]
    TokenizerVocab {
        path: PathBuf,
        checkpoint: PathBuf,
        largest: u32,
        vocab: usize,
    },
    #[error("the task text is {bytes} bytes, longer than the {MAX_PROMPT_BYTES} taken")]
    PromptTooLong { bytes: usize },
    #[error("cannot tokenize the prompt")]
    Tokenize(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error(transparent)]
    PromptTokens(#[from] TooLong),
    #[error(transparent)]
    Processor(#[from] ProcessorError),
    #[error("camera {camera}")]
    Frame {
        camera: usize,
        #[source]
        source: FrameError,
    },
    #[error("{0}")]
    Input(String),
    #[error(transparent)]
    Graph(#[from] GraphError),
    /// The graphs failed on a batch: each of its elements carries the error.
    #[error(transparent)]
    GraphBatch(Arc<PipelineError>),
    #[error(transparent)]
    NonFiniteActions(#[from] NonFiniteActions),
}

impl PipelineError {
    /// A bad checkpoint, exported graphs, tokenizer or observation (the user's input), rather
    /// than a failure of the computation or the graph runtime.
    pub fn is_input_error(&self) -> bool {
        match self {
            PipelineError::Graph(e) => e.is_input_error(),
            PipelineError::GraphBatch(e) => e.is_input_error(),
            PipelineError::NonFiniteActions(_) => false,
            _ => true,
        }
    }

    pub fn accelerator_fault(&self) -> Option<crate::policy::AcceleratorFault> {
        match self {
            PipelineError::Graph(e) => e.accelerator_fault(),
            PipelineError::GraphBatch(e) => e.accelerator_fault(),
            _ => None,
        }
    }
}
