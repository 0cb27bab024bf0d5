//! Offline models, their descriptions, datasets and data buffers, and executions: queued on a
//! stream, run at its synchronization.

use std::ffi::{c_char, CString};
use std::path::Path;

use super::memory::allocation;
use super::{Desc, Fail, Model, Named, State, Task};
use crate::codes::*;
use crate::exec::{self, Io};

impl State {
    pub fn load_model(&mut self, path: &Path) -> Result<u32, Fail> {
        let context = self.current()?;
        let text = std::fs::read_to_string(path)
            .map_err(|e| Fail::new(ACL_ERROR_INVALID_FILE, format!("{}: {e}", path.display())))?;
        let om: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
            Fail::new(
                ACL_ERROR_DESERIALIZE_MODEL,
                format!("{}: not an offline model: {e}", path.display()),
            )
        })?;
        let field = |k: &str| {
            om.get(k).and_then(|v| v.as_str()).ok_or_else(|| {
                Fail::new(
                    ACL_ERROR_DESERIALIZE_MODEL,
                    format!("{}: no `{k}`", path.display()),
                )
            })
        };
        if field("format")? != "ascendcl-model-om/1" {
            return Err(Fail::new(
                ACL_ERROR_DESERIALIZE_MODEL,
                format!("{}: not an offline model of this runtime", path.display()),
            ));
        }
        let onnx = path
            .parent()
            .unwrap_or(Path::new("."))
            .join(field("graph")?);
        let soc = field("soc_version")?.to_string();
        if !onnx.is_file() {
            return Err(Fail::new(
                ACL_ERROR_READ_MODEL_FAILURE,
                format!(
                    "{}: its graph {} is missing",
                    path.display(),
                    onnx.display()
                ),
            ));
        }
        let (session, inputs, outputs) =
            exec::open(&onnx).map_err(|e| Fail::new(ACL_ERROR_PARSE_MODEL, e))?;
        self.next_model += 1;
        let id = self.next_model;
        self.models.insert(
            id,
            Model {
                context,
                file: path.to_path_buf(),
                soc,
                session,
                inputs,
                outputs,
            },
        );
        Ok(id)
    }

    pub fn unload_model(&mut self, id: u32) -> Result<(), Fail> {
        if !self.models.contains_key(&id) {
            return Err(Fail::new(
                ACL_ERROR_INVALID_MODEL_ID,
                format!("model {id} is not loaded"),
            ));
        }
        if self
            .streams
            .values()
            .any(|s| s.queue.iter().any(|t| t.model == id))
        {
            return Err(Fail::new(
                ACL_ERROR_RT_MODEL_RUNNING,
                format!("model {id} has executions queued"),
            ));
        }
        self.models.remove(&id);
        Ok(())
    }

    pub fn create_desc(&mut self) -> usize {
        let h = self.handle();
        self.descs.insert(h, Desc::default());
        h
    }

    pub fn destroy_desc(&mut self, desc: usize) -> Result<(), Fail> {
        self.descs
            .remove(&desc)
            .map(|_| ())
            .ok_or_else(|| Fail::param("no such model description"))
    }

    pub fn get_desc(&mut self, desc: usize, id: u32) -> Result<(), Fail> {
        let model = self.models.get(&id).ok_or_else(|| {
            Fail::new(
                ACL_ERROR_INVALID_MODEL_ID,
                format!("model {id} is not loaded"),
            )
        })?;
        let named = |ios: &[Io]| {
            ios.iter()
                .map(|io| Named {
                    name: CString::new(io.name.clone()).unwrap_or_default(),
                    bytes: io.bytes,
                })
                .collect()
        };
        let filled = Desc {
            inputs: named(&model.inputs),
            outputs: named(&model.outputs),
        };
        let d = self
            .descs
            .get_mut(&desc)
            .ok_or_else(|| Fail::param("no such model description"))?;
        *d = filled;
        Ok(())
    }

    pub fn desc_io(&self, desc: usize, inputs: bool) -> &[Named] {
        match self.descs.get(&desc) {
            Some(d) if inputs => &d.inputs,
            Some(d) => &d.outputs,
            None => &[],
        }
    }

    pub fn desc_name(&self, desc: usize, inputs: bool, index: usize) -> *const c_char {
        self.desc_io(desc, inputs)
            .get(index)
            .map_or(std::ptr::null(), |n| n.name.as_ptr())
    }

    pub fn create_dataset(&mut self) -> usize {
        let h = self.handle();
        self.datasets.insert(h, Vec::new());
        h
    }

    pub fn destroy_dataset(&mut self, dataset: usize) -> Result<(), Fail> {
        self.datasets
            .remove(&dataset)
            .map(|_| ())
            .ok_or_else(|| Fail::param("no such dataset"))
    }

    pub fn add_dataset_buffer(&mut self, dataset: usize, buffer: usize) -> Result<(), Fail> {
        if !self.buffers.contains_key(&buffer) {
            return Err(Fail::param("no such data buffer"));
        }
        self.datasets
            .get_mut(&dataset)
            .ok_or_else(|| Fail::param("no such dataset"))?
            .push(buffer);
        Ok(())
    }

    pub fn create_data_buffer(&mut self, data: u64, size: usize) -> usize {
        let h = self.handle();
        self.buffers.insert(h, (data, size));
        h
    }

    pub fn destroy_data_buffer(&mut self, buffer: usize) -> Result<(), Fail> {
        self.buffers
            .remove(&buffer)
            .map(|_| ())
            .ok_or_else(|| Fail::param("no such data buffer"))
    }

    /// A dataset's buffers as device ranges, checked against the model's sizes.
    fn ranges(
        &self,
        dataset: usize,
        ios: &[Io],
        what: &str,
        code: i32,
    ) -> Result<Vec<(u64, usize)>, Fail> {
        let buffers = self
            .datasets
            .get(&dataset)
            .ok_or_else(|| Fail::param(format!("the {what} dataset does not exist")))?;
        if buffers.len() != ios.len() {
            return Err(Fail::new(
                code,
                format!(
                    "the model has {} {what}s, the dataset {}",
                    ios.len(),
                    buffers.len()
                ),
            ));
        }
        let mut out = Vec::new();
        for (b, io) in buffers.iter().zip(ios) {
            let &(address, size) = self.buffers.get(b).ok_or_else(|| {
                Fail::param(format!(
                    "{what} `{}`: its data buffer was destroyed",
                    io.name
                ))
            })?;
            if size < io.bytes {
                return Err(Fail::new(
                    code,
                    format!(
                        "{what} `{}`: a buffer of {size} bytes, the model needs {}",
                        io.name, io.bytes
                    ),
                ));
            }
            self.device_range(address, size, &format!("{what} `{}`", io.name))?;
            out.push((address, size));
        }
        Ok(out)
    }

    pub fn execute_async(
        &mut self,
        id: u32,
        input: usize,
        output: usize,
        stream: usize,
    ) -> Result<(), Fail> {
        let current = self.current()?;
        let s = self
            .streams
            .get(&stream)
            .ok_or_else(|| Fail::new(ACL_ERROR_RT_INVALID_HANDLE, "no such stream"))?;
        if s.context != current {
            return Err(Fail::new(
                ACL_ERROR_RT_STREAM_CONTEXT,
                "the stream belongs to another context",
            ));
        }
        let model = self.models.get(&id).ok_or_else(|| {
            Fail::new(
                ACL_ERROR_INVALID_MODEL_ID,
                format!("model {id} is not loaded"),
            )
        })?;
        if model.context != current {
            return Err(Fail::new(
                ACL_ERROR_RT_MODEL_CONTEXT,
                "the model belongs to another context",
            ));
        }
        let inputs = self.ranges(
            input,
            &model.inputs,
            "input",
            ACL_ERROR_MODEL_INPUT_NOT_MATCH,
        )?;
        let outputs = self.ranges(
            output,
            &model.outputs,
            "output",
            ACL_ERROR_MODEL_OUTPUT_NOT_MATCH,
        )?;
        self.executions += 1;
        let number = self.executions;
        if self.faults.execute_fail_after.is_some_and(|n| number > n) {
            // Refused as it is queued: what was queued before it stays on the stream.
            return Err(Fail::new(
                ACL_ERROR_RT_MODEL_EXECUTE,
                format!("execution {number} refused (ACL_MODEL_EXECUTE_FAIL_AFTER)"),
            ));
        }
        if let Some(s) = self.streams.get_mut(&stream) {
            s.queue.push(Task {
                model: id,
                inputs,
                outputs,
                number,
            });
        }
        Ok(())
    }

    pub fn synchronize(&mut self, stream: usize) -> Result<(), Fail> {
        let current = self.current()?;
        let s = self
            .streams
            .get_mut(&stream)
            .ok_or_else(|| Fail::new(ACL_ERROR_RT_INVALID_HANDLE, "no such stream"))?;
        if s.context != current {
            return Err(Fail::new(
                ACL_ERROR_RT_STREAM_CONTEXT,
                "the stream belongs to another context",
            ));
        }
        // A failed task ends the stream's work: what was queued after it is dropped.
        let tasks = std::mem::take(&mut s.queue);
        for task in tasks {
            self.run(task)?;
        }
        Ok(())
    }

    fn run(&mut self, task: Task) -> Result<(), Fail> {
        if self
            .faults
            .device_lost_after
            .is_some_and(|n| task.number > n)
        {
            self.lost = true;
            return Err(Fail::new(
                ACL_ERROR_RT_LOST_HEARTBEAT,
                "the device stopped answering during execution (ACL_MODEL_DEVICE_LOST_AFTER)",
            ));
        }
        let device_soc = self.soc.clone();
        let Some(model) = self.models.get_mut(&task.model) else {
            return Err(Fail::new(
                ACL_ERROR_INVALID_MODEL_ID,
                "the model was unloaded",
            ));
        };
        if model.soc != device_soc {
            return Err(Fail::new(
                ACL_ERROR_RT_MODEL_EXECUTE,
                format!(
                    "{} was compiled for {}, this device is {device_soc}",
                    model.file.display(),
                    model.soc
                ),
            ));
        }
        let mut data = Vec::with_capacity(task.inputs.len());
        for &(address, size) in &task.inputs {
            // Freed since it was queued: the execution reads nothing.
            let Some((_, bytes)) = allocation(&self.memory, address, size) else {
                return Err(Fail::new(
                    ACL_ERROR_RT_MODEL_EXECUTE,
                    "an input buffer was freed before execution",
                ));
            };
            data.push(bytes);
        }
        let model = self.models.get_mut(&task.model).expect("checked above");
        let results = exec::run(&mut model.session, &model.inputs, &model.outputs, &data)
            .map_err(|e| Fail::new(ACL_ERROR_RT_MODEL_EXECUTE, e))?;
        for (&(address, _), bytes) in task.outputs.iter().zip(results) {
            let base = self.device_range(address, bytes.len(), "output")?;
            let off = (address - base) as usize;
            if let Some(m) = self.memory.get_mut(&base) {
                m[off..off + bytes.len()].copy_from_slice(&bytes);
            }
        }
        self.executed += 1;
        Ok(())
    }
}
