"""Images, videos and figures for the trackers: what a user passes (torch tensors CHW/HWC, videos TCHW/THWC,
float in [0, 1] or uint8; numpy arrays; PIL images; matplotlib-like figures) made into uint8 HWC / THWC
numpy arrays, and their PNG / GIF encodings (PIL; TensorBoard shows a GIF image summary as a video, the
form torch's add_video writes, without moviepy)."""
import io
import logging
import re

import numpy as np


def _numpy(data):
    if hasattr(data, "detach"):  # a torch tensor, on any device, any dtype
        data = data.detach().float().cpu().numpy() if data.is_floating_point() else data.detach().cpu().numpy()
    return np.asarray(data)


_WARNED = set()  # the names already warned of negative float pixels


def _uint8(array, what="log_image"):
    if array.dtype == np.uint8:
        return array
    if np.issubdtype(array.dtype, np.floating) and what not in _WARNED and array.size and np.nanmin(array) < 0:
        _WARNED.add(what)
        logging.getLogger("giga_train").warning(
            "%s: float pixels from %.3g to %.3g are clipped to [0, 1] (a [-1, 1] image: pass (x + 1) / 2)", what,
            float(np.nanmin(array)), float(np.nanmax(array)))
    if np.issubdtype(array.dtype, np.floating) or array.dtype == np.bool_:
        return (np.clip(np.nan_to_num(array.astype(np.float32)), 0.0, 1.0) * 255 + 0.5).astype(np.uint8)
    return np.clip(array, 0, 255).astype(np.uint8)  # integer pixel values 0..255


def _channels_last(array, what):
    """(H, W, C) from (C, H, W) or (H, W, C) with C in 1, 3, 4; (H, W) gains C=1; grey stays one channel."""
    if array.ndim == 2:
        array = array[:, :, None]
    if array.ndim != 3:
        batch = " (a batch of images: log each, or side by side: torch.cat(list(images), dim=2))" if array.ndim == 4 \
            else ""
        raise ValueError(f"{what}: expected an image of 2 or 3 dimensions (CHW or HWC), got shape {array.shape}{batch}")
    if array.shape[-1] not in (1, 3, 4) and array.shape[0] in (1, 3, 4):
        array = array.transpose(1, 2, 0)
    if array.shape[-1] not in (1, 3, 4):
        raise ValueError(f"{what}: no channel dimension of 1, 3 or 4 in shape {array.shape} (CHW or HWC)")
    return array


def as_image(data, what="log_image"):
    """uint8 (H, W, C) of a tensor, array, PIL image or figure (anything with savefig, as matplotlib's)."""
    if hasattr(data, "savefig"):
        buffer = io.BytesIO()
        data.savefig(buffer, format="png")
        data = _pil_open(buffer.getvalue())
    if hasattr(data, "convert") and hasattr(data, "size"):  # a PIL image
        data = np.asarray(data.convert("RGBA" if data.mode in ("RGBA", "LA", "P") else "RGB"))
    return _uint8(_channels_last(_numpy(data), what), what)


def as_video(frames, what="log_video"):
    """uint8 (T, H, W, C) of (T, C, H, W) or (T, H, W, C) frames, or a list of images."""
    if isinstance(frames, (list, tuple)):
        return np.stack([as_image(frame, what) for frame in frames])
    array = _numpy(frames)
    if array.ndim != 4:
        raise ValueError(f"{what}: expected frames of 4 dimensions (T,C,H,W or T,H,W,C), got shape {array.shape}")
    return np.stack([_uint8(_channels_last(frame, what), what) for frame in array])


def _pil_open(data):
    from PIL import Image
    image = Image.open(io.BytesIO(data))
    image.load()
    return image


def _pil(image):
    from PIL import Image
    return Image.fromarray(image[:, :, 0] if image.shape[-1] == 1 else image)


def png_bytes(image):
    buffer = io.BytesIO()
    _pil(image).save(buffer, format="PNG")
    return buffer.getvalue()


def gif_bytes(video, fps):
    """An animated GIF of uint8 (T, H, W, C) frames at `fps`, looping."""
    frames = [_pil(frame if frame.shape[-1] != 4 else frame[:, :, :3]) for frame in video]
    buffer = io.BytesIO()
    frames[0].save(buffer, format="GIF", save_all=True, append_images=frames[1:], loop=0,
                   duration=max(int(round(1000 / fps)), 10))
    return buffer.getvalue()


def file_stem(name, step):
    """A file name of a media tag and step: 'val/sample' at 20 -> 'val_sample_000020'."""
    return f"{re.sub(r'[^A-Za-z0-9._-]+', '_', name).strip('_') or 'media'}_{step:06d}"
