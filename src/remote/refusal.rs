//! Why `serve` answers a request with an error frame instead of actions. The client is told
//! the whole chain as text (openpi's protocol has no error codes); the server keeps the type.

use crate::policy::openpi::msgpack_numpy::WireError;
use crate::policy::pi0::pipeline::PipelineError;

#[derive(Debug, thiserror::Error)]
pub(crate) enum Refusal {
    #[error("the server is stopping")]
    Stopping,
    #[error(transparent)]
    Wire(#[from] WireError),
    /// The decoder panicked (logged by the panic hook).
    #[error("the request could not be decoded (see the server's log)")]
    DecoderFailed,
    #[error("busy: {queue} requests are already waiting for the model; try again")]
    Busy { queue: usize },
    #[error("the model stopped")]
    ModelStopped,
    #[error("expected a binary msgpack frame, found text")]
    TextFrame,
    /// Boxed: the websocket error is large, and a refusal travels in every request's result.
    #[error("bad frame")]
    BadFrame(#[source] Box<tokio_tungstenite::tungstenite::Error>),
    /// The request's leftover chunk cannot guide the model.
    #[error("`prev_actions`")]
    Guidance(#[source] PipelineError),
    #[error(transparent)]
    Model(PipelineError),
    /// The model panicked on the batch this request was in.
    #[error("the model failed on this request (see the server's log)")]
    ModelPanicked,
}

impl Refusal {
    /// The text sent to the client: this error and its causes.
    pub(crate) fn shown(&self) -> String {
        crate::errors::Chain(self).to_string()
    }
}

/// Why a checkpoint cannot be served with the configured keys.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    #[error("optional camera `{camera}` is not one of the model's cameras ({cameras})")]
    OptionalCamera { camera: String, cameras: String },
    #[error("serve.images.{camera}: not one of the model's cameras ({cameras})")]
    ImageKey { camera: String, cameras: String },
}
