//! Arrow across the boundary through the C data interface: streams out (`__arrow_c_stream__`),
//! streams and schemas in (any object exporting `__arrow_c_stream__` / `__arrow_c_schema__`).

use std::sync::{Arc, Mutex};

use arrow::datatypes::{Schema, SchemaRef};
use arrow::error::ArrowError;
use arrow::ffi::FFI_ArrowSchema;
use arrow::ffi_stream::{ArrowArrayStreamReader, FFI_ArrowArrayStream};
use arrow::record_batch::{RecordBatch, RecordBatchReader};
use datafusion::execution::SendableRecordBatchStream;
use futures::StreamExt;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

use crate::errors::{InvalidArgumentError, OxlakeError};
use crate::runtime::runtime;

const STREAM: &std::ffi::CStr = c"arrow_array_stream";
const SCHEMA: &std::ffi::CStr = c"arrow_schema";

/// Pulls batches from a DataFusion stream, blocking on the runtime once per batch.
struct BlockingReader {
    schema: SchemaRef,
    stream: SendableRecordBatchStream,
    runtime: Arc<tokio::runtime::Runtime>,
}

impl Iterator for BlockingReader {
    type Item = Result<RecordBatch, ArrowError>;

    fn next(&mut self) -> Option<Self::Item> {
        // This runs inside the C stream's `get_next`, where a panic would abort the process: a
        // panic of a decoder below (oxlake catches those it knows of) ends the stream with an error.
        let polled =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.runtime.block_on(self.stream.next())));
        let next = match polled {
            Ok(next) => next?,
            Err(panic) => {
                let detail = match (panic.downcast_ref::<&str>(), panic.downcast_ref::<String>()) {
                    (Some(s), _) => (*s).to_string(),
                    (_, Some(s)) => s.clone(),
                    _ => "a panic without a message".to_string(),
                };
                let msg = format!("[oxlake.OxlakeError] the scan failed (a panic): {detail}");
                return Some(Err(ArrowError::ExternalError(Box::new(Tagged(msg)))));
            }
        };
        Some(
            next.map_err(|e| {
                ArrowError::ExternalError(Box::new(Tagged(crate::errors::tagged(&oxlake::Error::from(e)))))
            }),
        )
    }
}

/// An oxlake error as the text the C stream interface carries (see [`crate::errors::tagged`]).
#[derive(Debug)]
struct Tagged(String);

impl std::fmt::Display for Tagged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Tagged {}

impl RecordBatchReader for BlockingReader {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }
}

/// A stream of record batches from a scan. Consumed once, by `__arrow_c_stream__`.
#[pyclass(name = "RecordBatchStream", module = "oxlake._native")]
pub struct PyRecordBatchStream {
    inner: Mutex<Option<BlockingReader>>,
    schema: SchemaRef,
}

impl PyRecordBatchStream {
    pub fn new(stream: SendableRecordBatchStream) -> PyResult<Self> {
        let schema = stream.schema();
        let reader = BlockingReader { schema: schema.clone(), stream, runtime: runtime()? };
        Ok(PyRecordBatchStream { inner: Mutex::new(Some(reader)), schema })
    }
}

#[pymethods]
impl PyRecordBatchStream {
    /// Exports the stream (the Arrow PyCapsule interface). A stream can be exported once.
    #[pyo3(signature = (requested_schema=None))]
    fn __arrow_c_stream__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let _ = requested_schema;
        let reader = self
            .inner
            .lock()
            .map_err(|_| OxlakeError::new_err("stream lock poisoned"))?
            .take()
            .ok_or_else(|| OxlakeError::new_err("this stream was already consumed"))?;
        let ffi = FFI_ArrowArrayStream::new(Box::new(reader));
        PyCapsule::new_with_value(py, ffi, STREAM)
    }

    /// The schema of the batches (`pyarrow.schema(stream.schema)` converts it).
    #[getter]
    fn schema(&self) -> PySchema {
        PySchema(self.schema.clone())
    }
}

/// An Arrow schema exported through `__arrow_c_schema__`.
#[pyclass(name = "Schema", module = "oxlake._native")]
pub struct PySchema(pub SchemaRef);

#[pymethods]
impl PySchema {
    fn __arrow_c_schema__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyCapsule>> {
        let ffi = FFI_ArrowSchema::try_from(self.0.as_ref()).map_err(|e| OxlakeError::new_err(e.to_string()))?;
        PyCapsule::new_with_value(py, ffi, SCHEMA)
    }

    fn __repr__(&self) -> String {
        format!("Schema({})", self.0)
    }
}

/// Reads every batch of an object exporting `__arrow_c_stream__`.
pub fn import_batches(obj: &Bound<'_, PyAny>) -> PyResult<Vec<RecordBatch>> {
    let reader = import_reader(obj)?;
    let schema = reader.schema();
    let mut batches = Vec::new();
    let mut reader = reader;
    loop {
        let Some(b) = next_imported(&mut reader).map_err(crate::errors::to_py)? else { break };
        batches.push(b);
    }
    if batches.is_empty() {
        batches.push(RecordBatch::new_empty(schema));
    }
    Ok(batches)
}

/// The batches of an object exporting `__arrow_c_stream__`, read as they are asked for (a write
/// that streams its input); the producer is called from whichever thread asks, and takes the
/// GIL itself where it needs it (pyarrow does).
pub fn import_stream(obj: &Bound<'_, PyAny>) -> PyResult<Box<dyn Iterator<Item = oxlake::Result<RecordBatch>> + Send>> {
    let mut reader = import_reader(obj)?;
    let mut since_trim = 0;
    Ok(Box::new(std::iter::from_fn(move || {
        let next = next_imported(&mut reader).transpose();
        if let Some(Ok(batch)) = &next {
            since_trim += batch.get_array_memory_size();
            if since_trim >= TRIM_EVERY {
                since_trim = 0;
                trim_heap();
            }
        }
        next
    })))
}

/// Input bytes read between two [`trim_heap`] calls.
const TRIM_EVERY: usize = 256 << 20;

/// Returns the heap's free memory to the system. glibc keeps an arena per thread that
/// allocates, and frees into them without giving pages back: over a long streamed write
/// (chunks encoded on the runtime's threads) the process's resident memory rose with the input
/// (2.0 GB for 2 GB of input, 2.6 GB for 5 GB) although what it held stayed bounded.
fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` only releases free memory; it is safe to call from any thread.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The next batch of an imported stream. arrow-rs asserts (panics) on some inputs it
/// mis-imports, such as nested struct columns sliced at a non-zero offset by the producer: such
/// input is refused, never a panic.
fn next_imported(reader: &mut ArrowArrayStreamReader) -> oxlake::Result<Option<RecordBatch>> {
    let next = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| reader.next())).map_err(|_| {
        oxlake::Error::InvalidData {
            detail: "the Arrow input could not be imported (a nested column sliced at an offset?); pass a copy of \
                     the data"
                .into(),
        }
    })?;
    next.transpose().map_err(|e| oxlake::Error::InvalidArgument {
        name: "data".into(),
        detail: format!("reading the input stream: {e}"),
    })
}

fn import_reader(obj: &Bound<'_, PyAny>) -> PyResult<ArrowArrayStreamReader> {
    let capsule = obj
        .call_method0("__arrow_c_stream__")
        .map_err(|_| InvalidArgumentError::new_err("data must be Arrow data (an object with __arrow_c_stream__)"))?;
    let capsule = capsule
        .cast_into::<PyCapsule>()
        .map_err(|_| InvalidArgumentError::new_err("__arrow_c_stream__ did not return a capsule"))?;
    let ptr = capsule.pointer_checked(Some(STREAM))?;
    // SAFETY: the capsule holds an `ArrowArrayStream` (checked by name); `from_raw` moves it out and
    // leaves a released stream behind, so the capsule's destructor will not release it twice.
    let reader = unsafe { ArrowArrayStreamReader::from_raw(ptr.as_ptr().cast::<FFI_ArrowArrayStream>()) }
        .map_err(|e| InvalidArgumentError::new_err(format!("invalid Arrow stream: {e}")))?;
    Ok(reader)
}

/// Imports an object exporting `__arrow_c_schema__`.
pub fn import_schema(obj: &Bound<'_, PyAny>) -> PyResult<SchemaRef> {
    let capsule = obj.call_method0("__arrow_c_schema__").map_err(|_| {
        InvalidArgumentError::new_err("schema must be an Arrow schema (an object with __arrow_c_schema__)")
    })?;
    let capsule = capsule
        .cast_into::<PyCapsule>()
        .map_err(|_| InvalidArgumentError::new_err("__arrow_c_schema__ did not return a capsule"))?;
    let ptr = capsule.pointer_checked(Some(SCHEMA))?;
    // SAFETY: the capsule holds an `ArrowSchema` (checked by name) that stays alive while we read it.
    let ffi = unsafe { &*ptr.as_ptr().cast::<FFI_ArrowSchema>() };
    let schema =
        Schema::try_from(ffi).map_err(|e| InvalidArgumentError::new_err(format!("invalid Arrow schema: {e}")))?;
    Ok(Arc::new(schema))
}
