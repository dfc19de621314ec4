//! CRI StreamImages (KEP-5825, kubelet gate `CRIListStreaming`): the images of one ListImages
//! answer, sent as a stream of messages each image in exactly one. A StreamImagesRequest reads on
//! the wire as a ListImagesRequest (the filter is field 1 of both) and a StreamImagesResponse as a
//! ListImagesResponse (the images are field 1 of both), so an answer is cut between its images,
//! never decoded: every byte the runtime sent reaches the caller.

use bytes::Bytes;
use prost::encoding::{WireType, decode_key, decode_varint};

/// The most bytes one message holds (an image larger than that goes alone): under the 4 MiB a
/// gRPC client accepts by default, so that any client reads the stream.
pub const MESSAGE_BYTES: usize = 1024 * 1024;

/// `answer`, a ListImagesResponse, cut between its images into messages of at most `limit`
/// bytes; none for an answer without images. An answer that does not read as protobuf is passed
/// on whole, for the caller to judge, as the runtime sent it.
pub fn cut(answer: Bytes, limit: usize) -> Vec<Bytes> {
    let Some(fields) = fields(&answer) else { return vec![answer] };
    let mut messages = Vec::new();
    let mut start = 0;
    for (field_start, field_end) in fields {
        if field_end - start > limit && field_start > start {
            messages.push(answer.slice(start..field_start));
            start = field_start;
        }
    }
    if answer.len() > start {
        messages.push(answer.slice(start..));
    }
    messages
}

/// Where each top-level field of `message` starts and ends; `None` when it does not read.
fn fields(message: &Bytes) -> Option<Vec<(usize, usize)>> {
    let mut rest = &message[..];
    let mut fields = Vec::new();
    while !rest.is_empty() {
        let start = message.len() - rest.len();
        let (_, wire_type) = decode_key(&mut rest).ok()?;
        let skip = match wire_type {
            WireType::Varint => {
                decode_varint(&mut rest).ok()?;
                0
            }
            WireType::SixtyFourBit => 8,
            WireType::ThirtyTwoBit => 4,
            WireType::LengthDelimited => usize::try_from(decode_varint(&mut rest).ok()?).ok()?,
            WireType::StartGroup | WireType::EndGroup => return None,
        };
        rest = rest.get(skip..)?;
        fields.push((start, message.len() - rest.len()));
    }
    Some(fields)
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;
    use crate::cri::{Image, ListImagesResponse, StreamImagesResponse};

    fn image(id: &str, padding: usize) -> Image {
        Image { id: id.into(), repo_tags: vec!["x".repeat(padding)], size: 7, ..Default::default() }
    }

    fn answer(images: Vec<Image>) -> Bytes {
        ListImagesResponse { images }.encode_to_vec().into()
    }

    fn streamed(messages: &[Bytes]) -> Vec<Image> {
        let each = messages.iter().map(|message| StreamImagesResponse::decode(message.clone()).expect("decodes"));
        each.flat_map(|message| message.images).collect()
    }

    #[test]
    fn every_image_is_streamed_exactly_once_in_order_and_no_message_is_over_the_limit() {
        let images: Vec<Image> = (0..50).map(|i| image(&format!("sha256:{i:02}"), 100 + i * 7)).collect();
        let whole = answer(images.clone());
        for limit in [1, 200, 1000, 4096, MESSAGE_BYTES] {
            let messages = cut(whole.clone(), limit);
            assert_eq!(streamed(&messages), images, "limit {limit}");
            assert_eq!(messages.concat(), whole.to_vec(), "the runtime's bytes, cut, never changed");
            let largest_image = images.iter().map(|image| image.encoded_len() + 3).max().unwrap_or(0);
            assert!(messages.iter().all(|message| message.len() <= limit.max(largest_image)), "limit {limit}");
        }
        assert_eq!(cut(whole.clone(), MESSAGE_BYTES).len(), 1, "a small answer is one message");
        assert_eq!(cut(whole, 1).len(), 50, "an image larger than the limit goes alone");
    }

    #[test]
    fn no_images_is_no_message_and_an_unreadable_answer_is_passed_on_whole() {
        assert!(cut(answer(Vec::new()), MESSAGE_BYTES).is_empty());
        let unreadable = Bytes::from_static(&[0x0a, 0x80]);
        assert_eq!(cut(unreadable.clone(), MESSAGE_BYTES), vec![unreadable]);
    }

    #[test]
    fn a_field_we_do_not_know_stays_where_the_runtime_put_it() {
        let mut whole = answer(vec![image("sha256:a", 10)]).to_vec();
        whole.extend_from_slice(&[0x10, 0x2a]); // field 2, varint 42
        whole.extend_from_slice(&answer(vec![image("sha256:b", 10)]));
        let messages = cut(Bytes::from(whole.clone()), 30);
        assert_eq!(messages.concat(), whole);
        assert_eq!(streamed(&messages).len(), 2);
    }
}
