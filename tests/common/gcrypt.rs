//! An independent implementation of dm-crypt's serpent, twofish and AES sector ciphers for the
//! tests: libgcrypt (XTS, CBC and ECB), loaded with dlopen so a machine without it skips the
//! test (through [`super::env::missing`]) instead of failing to link. IVs are computed here
//! from dm-crypt's definitions: plain64 (the sector little-endian) and essiv:sha256 (plain64
//! encrypted with the cipher keyed by SHA-256 of the volume key).

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

type Handle = *mut c_void;
type OpenFn = unsafe extern "C" fn(*mut Handle, c_int, c_int, c_uint) -> c_uint;
type SetFn = unsafe extern "C" fn(Handle, *const c_void, usize) -> c_uint;
type CryptFn = unsafe extern "C" fn(Handle, *mut c_void, usize, *const c_void, usize) -> c_uint;
type CloseFn = unsafe extern "C" fn(Handle);
type MapFn = unsafe extern "C" fn(*const c_char) -> c_int;

const MODE_ECB: c_int = 1;
const MODE_CBC: c_int = 3;
const MODE_XTS: c_int = 13;

/// libgcrypt's cipher functions.
pub struct Gcrypt {
    open: OpenFn,
    setkey: SetFn,
    setiv: SetFn,
    encrypt: CryptFn,
    decrypt: CryptFn,
    close: CloseFn,
    map_name: MapFn,
}

/// libgcrypt, or `None` after reporting it missing ([`super::env::missing`]).
pub fn load() -> Option<Gcrypt> {
    // SAFETY: dlopen/dlsym of a system library by name; every symbol is checked for null and
    // cast to its documented C signature (gcrypt.h).
    unsafe {
        let lib = libc::dlopen(c"libgcrypt.so.20".as_ptr(), libc::RTLD_NOW);
        if lib.is_null() {
            super::env::missing("libgcrypt.so.20 is not installed (apt-get install libgcrypt20)");
            return None;
        }
        let sym = |name: &CStr| {
            let p = libc::dlsym(lib, name.as_ptr());
            assert!(!p.is_null(), "libgcrypt has no {name:?}");
            p
        };
        type CheckFn = unsafe extern "C" fn(*const c_char) -> *const c_char;
        type ControlFn = unsafe extern "C" fn(c_int, ...) -> c_uint;
        let check = std::mem::transmute::<*mut c_void, CheckFn>(sym(c"gcry_check_version"));
        let control = std::mem::transmute::<*mut c_void, ControlFn>(sym(c"gcry_control"));
        check(std::ptr::null());
        // GCRYCTL_INITIALIZATION_FINISHED
        control(38, 0);
        Some(Gcrypt {
            open: std::mem::transmute::<*mut c_void, OpenFn>(sym(c"gcry_cipher_open")),
            setkey: std::mem::transmute::<*mut c_void, SetFn>(sym(c"gcry_cipher_setkey")),
            setiv: std::mem::transmute::<*mut c_void, SetFn>(sym(c"gcry_cipher_setiv")),
            encrypt: std::mem::transmute::<*mut c_void, CryptFn>(sym(c"gcry_cipher_encrypt")),
            decrypt: std::mem::transmute::<*mut c_void, CryptFn>(sym(c"gcry_cipher_decrypt")),
            close: std::mem::transmute::<*mut c_void, CloseFn>(sym(c"gcry_cipher_close")),
            map_name: std::mem::transmute::<*mut c_void, MapFn>(sym(c"gcry_cipher_map_name")),
        })
    }
}

impl Gcrypt {
    /// `data` in place through `cipher` ("serpent", "twofish", "aes") in `mode` with `key`,
    /// one call from `iv`.
    fn run(
        &self,
        cipher: &str,
        mode: c_int,
        key: &[u8],
        iv: Option<&[u8; 16]>,
        data: &mut [u8],
        encrypt: bool,
    ) {
        let bits = if mode == MODE_XTS {
            key.len() * 4
        } else {
            key.len() * 8
        };
        let name = match (cipher, bits) {
            ("aes", 128) => "AES".to_string(),
            ("twofish", 256) => "TWOFISH".to_string(),
            (c, b) => format!("{}{b}", c.to_ascii_uppercase()),
        };
        let cname = std::ffi::CString::new(name.clone()).unwrap();
        // SAFETY: documented libgcrypt calls on a handle opened here and closed at the end;
        // buffers are valid for the lengths given (in-place operation with a null input).
        unsafe {
            let algo = (self.map_name)(cname.as_ptr());
            assert!(algo > 0, "libgcrypt has no cipher {name}");
            let mut h: Handle = std::ptr::null_mut();
            assert_eq!(
                (self.open)(&mut h, algo, mode, 0),
                0,
                "gcry_cipher_open {name}"
            );
            assert_eq!(
                (self.setkey)(h, key.as_ptr().cast(), key.len()),
                0,
                "setkey {name}"
            );
            if let Some(iv) = iv {
                assert_eq!((self.setiv)(h, iv.as_ptr().cast(), 16), 0);
            }
            let f = if encrypt { self.encrypt } else { self.decrypt };
            let r = f(h, data.as_mut_ptr().cast(), data.len(), std::ptr::null(), 0);
            (self.close)(h);
            assert_eq!(r, 0, "libgcrypt {name} failed");
        }
    }

    /// dm-crypt's `spec` ("serpent-xts-plain64", "twofish-cbc-essiv:sha256", ...) over whole
    /// `sector_size` sectors of `data`, the first with IV sector `first` (IV sectors count
    /// 512-byte units, as dm-crypt's do without iv_large_sectors).
    pub fn sectors(
        &self,
        spec: &str,
        key: &[u8],
        data: &mut [u8],
        first: u64,
        sector_size: usize,
        encrypt: bool,
    ) {
        let mut parts = spec.splitn(3, '-');
        let (cipher, mode, ivmode) = (
            parts.next().unwrap(),
            parts.next().unwrap(),
            parts.next().unwrap(),
        );
        let mode = match mode {
            "xts" => MODE_XTS,
            "cbc" => MODE_CBC,
            m => panic!("no libgcrypt reference for mode {m}"),
        };
        for (i, sector) in data.chunks_mut(sector_size).enumerate() {
            let n = first + (i * sector_size / 512) as u64;
            let mut iv = [0u8; 16];
            iv[..8].copy_from_slice(&n.to_le_bytes());
            match ivmode {
                "plain64" => {}
                "essiv:sha256" => {
                    use sha2::Digest;
                    let salt = sha2::Sha256::digest(key);
                    self.run(cipher, MODE_ECB, &salt, None, &mut iv, true);
                }
                m => panic!("no reference IV for {m}"),
            }
            self.run(cipher, mode, key, Some(&iv), sector, encrypt);
        }
    }
}
