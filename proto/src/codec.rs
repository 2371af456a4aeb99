//! The protobuf codec every generated service and client uses: prost's,
//! with buffers sized for what respcoord sends.
//!
//! tonic's default keeps an 8 KiB encode buffer for the whole life of a
//! streaming response. A Watch is held open for a whole call and sends a
//! few events per response (an event with a 36-byte session id encodes to
//! about 85 bytes with its frame header, a bookmark to about 15), so on a
//! replica holding a watch per live call that default was the largest part
//! of what an open watch cost (docs/operations.md, "Memory"). The buffer
//! grows on demand for the rare large message (a backlog replay, a listing
//! page) and is given back with the call.
//!
//! A Watch's buffer starts empty: it lives as long as the stream, and a
//! session watch waits most of its life, so it holds nothing until its
//! first message and then what its largest message needed.

use std::{any::TypeId, marker::PhantomData};

use prost::Message;
use tonic::codec::BufferSettings;
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

/// Initial size of a call's encode buffer: a supersede's three events, or
/// one reply, without growing.
pub const BUFFER_SIZE: usize = 256;

/// Past this many encoded bytes a streaming response hands its buffer to
/// the transport (tonic's default).
const YIELD_THRESHOLD: usize = 32 * 1024;

fn encode_settings<T: 'static>() -> BufferSettings {
    let initial = if TypeId::of::<T>() == TypeId::of::<crate::v1::WatchResponse>() {
        0
    } else {
        BUFFER_SIZE
    };
    BufferSettings::new(initial, YIELD_THRESHOLD)
}

/// prost's codec with a [`BUFFER_SIZE`] encode buffer (named by `build.rs`
/// as the generated code's codec).
#[derive(Debug, Clone, Copy)]
pub struct Codec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for Codec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<T, U> tonic::codec::Codec for Codec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::raw_encoder(encode_settings::<T>())
    }

    /// tonic's default: a call's request is decoded once and dropped, and a
    /// client reading a busy watch-all decodes large batches, which a small
    /// buffer would grow and regrow for.
    fn decoder(&mut self) -> Self::Decoder {
        ProstCodec::<T, U>::raw_decoder(BufferSettings::default())
    }
}
