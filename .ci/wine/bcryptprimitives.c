/*
 * A stand-in for Windows' bcryptprimitives.dll, for running the crate's Windows
 * test binaries under wine 8.0, which lacks the DLL.
 *
 * Rust's std (1.78 and later) imports ProcessPrng from bcryptprimitives.dll for
 * its random seeds (HashMap keys); without it a binary exits with status 53
 * before main. This DLL exports ProcessPrng and fills the buffer through
 * advapi32's SystemFunction036 (RtlGenRandom), which wine has. Test tooling only:
 * it is copied into a wine prefix's system32 by .ci/wine.sh, never shipped.
 *
 * Build: x86_64-w64-mingw32-gcc -shared -O2 -o bcryptprimitives.dll \
 *            bcryptprimitives.c -ladvapi32
 */
#include <windows.h>

/* advapi32's RtlGenRandom, exported under this name. */
BOOLEAN WINAPI SystemFunction036(PVOID buffer, ULONG length);

/* ProcessPrng(data, len): fills `len` bytes; always TRUE on Windows. RtlGenRandom
 * takes a 32-bit length, so a larger request is filled in pieces. */
__declspec(dllexport) BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T len)
{
    while (len > 0) {
        ULONG piece = len > 0x40000000 ? 0x40000000 : (ULONG)len;
        if (!SystemFunction036(data, piece))
            return FALSE;
        data += piece;
        len -= piece;
    }
    return TRUE;
}
