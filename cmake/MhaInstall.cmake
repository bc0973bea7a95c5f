# `cmake --install`: a relocatable tree with the header, the libraries, a CMake package
# (find_package(mha CONFIG REQUIRED [COMPONENTS cuda opencl]) gives mha::mha and mha::<device>)
# and pkg-config files (mha, mha-cuda, mha-opencl). Every library carries its kernels and
# Halide's runtime, so a consumer needs no Halide, LLVM or Python.
include(CMakePackageConfigHelpers)

set(MHA_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/mha)
set(MHA_INSTALL_PKGCONFIGDIR ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
# A shared libmha_<device> finds libmha beside it, wherever the tree is moved.
set_target_properties(mha PROPERTIES INSTALL_RPATH "$ORIGIN")

# The public headers: mha.h and what it includes.
install(DIRECTORY ${PROJECT_SOURCE_DIR}/runtime/include/mha DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS mha EXPORT mha-targets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(EXPORT mha-targets NAMESPACE mha:: DESTINATION ${MHA_INSTALL_CMAKEDIR})

# pkg-config finds the prefix from where the .pc file lies (${pcfiledir}), not from where the
# tree was installed.
file(RELATIVE_PATH pkgconfig_to_prefix ${CMAKE_INSTALL_PREFIX}/${MHA_INSTALL_PKGCONFIGDIR}
     ${CMAKE_INSTALL_PREFIX})
set(MHA_PKGCONFIG_PREFIX "\${pcfiledir}/${pkgconfig_to_prefix}")
# A static libmha needs its system libraries on the consumer's link line; a shared one brings them.
list(TRANSFORM CMAKE_DL_LIBS PREPEND "-l" OUTPUT_VARIABLE dl_flags)
string(JOIN " " system_libs -pthread ${dl_flags})
if (BUILD_SHARED_LIBS)
    set(MHA_PKGCONFIG_LINK_SYSTEM "")
    set(MHA_PKGCONFIG_DEPENDENCIES "Libs.private: ${system_libs}")
else ()
    set(MHA_PKGCONFIG_LINK_SYSTEM "${system_libs}")
    set(MHA_PKGCONFIG_DEPENDENCIES "")
endif ()

set(MHA_COMPONENTS "")
foreach (device IN LISTS MHA_KERNEL_DEVICES)
    if (device STREQUAL "cpu")
        configure_file(${CMAKE_CURRENT_LIST_DIR}/mha.pc.in ${PROJECT_BINARY_DIR}/pkgconfig/mha.pc
                       @ONLY)
        install(FILES ${PROJECT_BINARY_DIR}/pkgconfig/mha.pc DESTINATION ${MHA_INSTALL_PKGCONFIGDIR})
        continue()
    endif ()
    list(APPEND MHA_COMPONENTS ${device})
    set_target_properties(mha_${device} PROPERTIES INSTALL_RPATH "$ORIGIN")
    install(TARGETS mha_${device} EXPORT mha-${device}-targets
            ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
            LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
    install(EXPORT mha-${device}-targets NAMESPACE mha:: DESTINATION ${MHA_INSTALL_CMAKEDIR})
    set(MHA_DEVICE ${device})
    configure_file(${CMAKE_CURRENT_LIST_DIR}/mha-device.pc.in
                   ${PROJECT_BINARY_DIR}/pkgconfig/mha-${device}.pc @ONLY)
    install(FILES ${PROJECT_BINARY_DIR}/pkgconfig/mha-${device}.pc
            DESTINATION ${MHA_INSTALL_PKGCONFIGDIR})
endforeach ()

configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/mhaConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/mhaConfig.cmake
                              INSTALL_DESTINATION ${MHA_INSTALL_CMAKEDIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/mhaConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/mhaConfig.cmake ${PROJECT_BINARY_DIR}/mhaConfigVersion.cmake
              ${PROJECT_SOURCE_DIR}/cmake/MhaCpuArch.cmake
        DESTINATION ${MHA_INSTALL_CMAKEDIR})
