//! The protobuf codec of the gRPC services: prost's, except that a request
//! that is not a valid message is INVALID_ARGUMENT (the client's fault),
//! where tonic would answer INTERNAL.

use std::marker::PhantomData;

use prost::Message;
use tonic::Status;
use tonic::codec::{DecodeBuf, Decoder};
use tonic_prost::ProstCodec;

/// Named by the generated server stubs (build.rs `codec_path`).
#[derive(Debug, Clone)]
pub(crate) struct Codec<T, U> {
    prost: ProstCodec<T, U>,
}

impl<T, U> Default for Codec<T, U> {
    fn default() -> Self {
        Codec {
            prost: ProstCodec::default(),
        }
    }
}

impl<T, U> tonic::codec::Codec for Codec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = <ProstCodec<T, U> as tonic::codec::Codec>::Encoder;
    type Decoder = StrictDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        self.prost.encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        StrictDecoder(PhantomData)
    }
}

/// Decodes one request message; a malformed one is the caller's error.
#[derive(Debug)]
pub(crate) struct StrictDecoder<U>(PhantomData<U>);

impl<U: Message + Default> Decoder for StrictDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        U::decode(buf).map(Some).map_err(|e| {
            Status::invalid_argument(format!(
                "the request is not a valid {} message: {e}",
                std::any::type_name::<U>()
                    .rsplit("::")
                    .next()
                    .unwrap_or("protobuf")
            ))
        })
    }
}
