"""Images at the edge, fetched safely (api/http/shared/media/): against a loopback HTTP server.

URLs are refused by default; allowed when the test allow-lists (trusts) the server's origin;
redirects to 127.0.0.1, 10.0.0.1 and 169.254.169.254 are refused before any connection; a host
name resolving to loopback is refused; oversize bytes, a huge canvas and a truncated image are
each a 400 naming the part. The server's log of requests shows what was (not) fetched.
"""

from __future__ import annotations

import ipaddress

import pytest

from api.http.platform.media import MediaPolicy
from api.http.shared.media import load_images
from api.http.shared.media.addresses import is_public
from runtime.errors import InvalidRequest
from runtime.images import ImageRef, content_hash
from tests.support.images import data_uri, huge_canvas_png, image_server, pil_image, png_bytes

PARAM = "messages[1].content[2].image_url"


def ref(url: str) -> ImageRef:
    return ImageRef(url=url, param=PARAM)


async def refused(policy: MediaPolicy, url: str, max_images: int = 4) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        await load_images([ref(url)], policy, max_images)
    assert info.value.status == 400 and info.value.param == PARAM
    return info.value


async def test_data_uri_decodes_and_hashes_the_pixels() -> None:
    png = png_bytes(40, 30, seed=1)
    (image,) = await load_images([ref(data_uri(png))], MediaPolicy(), 4)
    assert (image.width, image.height) == (40, 30)
    assert image.pixels == pil_image(png).tobytes()
    assert image.hash == content_hash(40, 30, image.pixels)
    other = (await load_images([ref(data_uri(png_bytes(40, 30, seed=2)))], MediaPolicy(), 4))[0]
    assert other.hash != image.hash


async def test_urls_are_refused_by_default_and_nothing_is_fetched() -> None:
    async with image_server() as server:
        server.routes["/a.png"] = (200, [("Content-Type", "image/png")], png_bytes())
        error = await refused(MediaPolicy(), server.url("/a.png"))
        assert "not fetched" in str(error)
        # Any public host allowed: loopback is still not public.
        error = await refused(MediaPolicy(allow_public_media=True), server.url("/a.png"))
        assert "not a public address" in str(error)
        # The name allow-listed, its address still loopback.
        await refused(MediaPolicy(allowed_media_domains=("127.0.0.1",)), server.url("/a.png"))
        assert server.hits == []


async def test_an_allow_listed_origin_is_fetched() -> None:
    async with image_server() as server:
        png = png_bytes(20, 10, seed=3)
        server.routes["/a.png"] = (200, [("Content-Type", "image/png")], png)
        policy = MediaPolicy(trusted_media_origins=(f"http://127.0.0.1:{server.port}",))
        (image,) = await load_images([ref(server.url("/a.png"))], policy, 4)
        assert (image.width, image.height) == (20, 10) and server.hits == ["/a.png"]


@pytest.mark.parametrize("target", ["http://127.0.0.1:{port}/b.png", "http://10.0.0.1/b.png", "http://169.254.169.254/latest/meta-data/", "http://[::ffff:127.0.0.1]:{port}/b.png"])
async def test_redirects_to_private_addresses_are_refused(target: str) -> None:
    async with image_server() as server:
        # The trusted origin is one port; the redirect goes elsewhere.
        async with image_server() as other:
            other.routes["/b.png"] = (200, [], png_bytes())
            location = target.format(port=other.port)
            server.routes["/a.png"] = (302, [("Location", location)], b"")
            policy = MediaPolicy(trusted_media_origins=(f"http://127.0.0.1:{server.port}",), allow_public_media=True)
            error = await refused(policy, server.url("/a.png"))
            assert "not a public address" in str(error)
            assert server.hits == ["/a.png"] and other.hits == []


async def test_a_name_resolving_to_loopback_is_refused() -> None:
    async with image_server() as server:
        server.routes["/a.png"] = (200, [], png_bytes())

        async def resolver(host: str, port: int) -> list[str]:
            return ["93.184.215.14", "127.0.0.1"] if host == "images.example.com" else []

        policy = MediaPolicy(allowed_media_domains=("images.example.com",), resolver=resolver)
        error = await refused(policy, f"http://images.example.com:{server.port}/a.png")
        assert "127.0.0.1" in str(error) and server.hits == []


async def test_too_many_redirects_and_bad_schemes() -> None:
    async with image_server() as server:
        origin = f"http://127.0.0.1:{server.port}"
        server.routes["/loop"] = (302, [("Location", "/loop")], b"")
        policy = MediaPolicy(trusted_media_origins=(origin,))
        assert "redirected more than" in str(await refused(policy, server.url("/loop")))
        server.routes["/ftp"] = (302, [("Location", "ftp://example.com/x.png")], b"")
        await refused(policy, server.url("/ftp"))
    await refused(MediaPolicy(allow_public_media=True), "gopher://example.com/x")
    await refused(MediaPolicy(allow_public_media=True), "http://user:pw@example.com/x.png")


async def test_oversize_huge_and_truncated_images_are_400s() -> None:
    png = png_bytes(64, 64, seed=4)
    async with image_server() as server:
        server.routes["/big.png"] = (200, [], png)
        policy = MediaPolicy(trusted_media_origins=(f"http://127.0.0.1:{server.port}",), max_image_bytes=len(png) - 1)
        assert (await refused(policy, server.url("/big.png"))).code == "image_too_large"
    assert (await refused(MediaPolicy(max_image_bytes=100), data_uri(png))).code == "image_too_large"
    assert (await refused(MediaPolicy(), data_uri(huge_canvas_png()))).code == "image_too_large"
    assert (await refused(MediaPolicy(max_image_pixels=64 * 63), data_uri(png))).code == "image_too_large"
    assert (await refused(MediaPolicy(), data_uri(png[: len(png) // 2]))).code == "invalid_image"
    assert (await refused(MediaPolicy(), data_uri(b"not an image"))).code == "invalid_image"
    assert (await refused(MediaPolicy(), "data:image/png;base64,@@@")).code == "invalid_image_url"


async def test_images_per_prompt_are_capped() -> None:
    uri = data_uri(png_bytes())
    refs = [ImageRef(url=uri, param=f"messages[0].content[{i}].image_url") for i in range(3)]
    with pytest.raises(InvalidRequest) as info:
        await load_images(refs, MediaPolicy(), 2)
    assert info.value.param == "messages[0].content[2].image_url" and info.value.code == "too_many_images"


async def test_file_urls_only_from_the_media_dir(tmp_path) -> None:  # type: ignore[no-untyped-def]
    inside = tmp_path / "media"
    inside.mkdir()
    (inside / "a.png").write_bytes(png_bytes(8, 8))
    (tmp_path / "secret.png").write_bytes(png_bytes(8, 8))
    (inside / "link.png").symlink_to(tmp_path / "secret.png")
    await refused(MediaPolicy(), f"file://{inside}/a.png")
    policy = MediaPolicy(media_dir=str(inside))
    (image,) = await load_images([ref(f"file://{inside}/a.png")], policy, 1)
    assert image.width == 8
    await refused(policy, f"file://{inside}/../secret.png")
    await refused(policy, f"file://{inside}/link.png")


@pytest.mark.parametrize(
    ("address", "public"),
    [
        ("8.8.8.8", True), ("127.0.0.1", False), ("10.0.0.1", False), ("172.16.5.4", False), ("192.168.1.1", False),
        ("169.254.169.254", False), ("100.64.0.1", False), ("0.0.0.0", False), ("::1", False), ("fe80::1", False),
        ("fc00::1", False), ("::ffff:127.0.0.1", False), ("::ffff:8.8.8.8", True), ("64:ff9b::a00:1", False), ("2002:7f00:1::", False),
        ("2606:4700:4700::1111", True), ("224.0.0.1", False),
    ],
)  # fmt: skip
def test_public_addresses(address: str, public: bool) -> None:
    assert is_public(ipaddress.ip_address(address)) is public
